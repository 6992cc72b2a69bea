"""SIGTERM with `--shutdown-timeout`, on real vLLM 0.32 and on `shoal sim`
alike: what shoal's engine pods get when a rollout or a node drain stops them
(spec.engine.shutdownTimeoutSeconds). Requests in flight run to their end,
new ones fail with a 500 (which the router retries on another replica),
/health still answers, and the process exits 0.

Without the flag (vLLM's default, 0) real vLLM refuses new connections and
its requests in flight never get an answer (the clients wait out their own
timeouts); the simulator closes them instead. Not compared here: shoal
passes the flag unless told 0."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from shoal.procs import free_port
from tests.vllm.conftest import real_command, sim_command, start_server

SHUTDOWN_TIMEOUT = 20
SHUT_DOWN = {
    "error": {
        "message": "cannot schedule new futures after shutdown",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
}


def _command(
    kind: str, vllm_python: Path, tiny_model: Path
) -> Callable[[int], tuple[list[str], dict[str, str]]]:
    if kind == "vllm":
        return lambda port: real_command(vllm_python, tiny_model, port)
    return lambda port: sim_command(tiny_model, port)


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_sigterm_lets_requests_in_flight_finish_and_fails_new_ones(
    kind: str, vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    cmd, env = _command(kind, vllm_python, tiny_model)(port)
    cmd += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
    server = start_server(kind, cmd, port, tmp_path / f"{kind}.log", env)
    with server.process:
        begun = threading.Event()
        lines: list[str] = []

        def stream() -> None:
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 1500, "stream": True}
            body["ignore_eos"] = True
            # Counted by the engine: a busy vLLM sends two tokens in one chunk.
            body["stream_options"] = {"include_usage": True}
            with httpx.stream(
                "POST", f"{server.url}/v1/completions", json=body, timeout=60
            ) as answer:
                for line in answer.iter_lines():
                    if line:
                        lines.append(line)
                        begun.set()

        worker = threading.Thread(target=stream)
        worker.start()
        assert begun.wait(30), "the stream never began"
        server.process.popen.send_signal(signal.SIGTERM)
        new = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "tiny", "prompt": "late", "max_tokens": 4},
            timeout=30,
        )
        assert (new.status_code, new.json()) == (500, SHUT_DOWN), new.text
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        worker.join(timeout=60)
        assert lines[-1] == "data: [DONE]", lines[-3:]
        usage = json.loads(lines[-2].removeprefix("data: "))["usage"]
        assert usage["completion_tokens"] == 1500, usage
        last = json.loads(lines[-3].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length", last
        assert server.process.wait_exit(timeout=SHUTDOWN_TIMEOUT + 30) == 0
