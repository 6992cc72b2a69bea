"""`shoal sim`: start simulated vLLM 0.32 engines.

Takes vLLM's own `serve` flags, so an engine pod's arguments start it
unchanged (parallelism and other flags that change nothing here are accepted
and ignored), plus `--sim-*` flags.
`--host/--port` is the first engine; each `--sim-listen IP:PORT` adds an
independent engine in the same process (given only `--sim-listen`, those are
all the engines).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from shoal.sim.auth import api_keys
from shoal.sim.config import EngineConfig, KVCacheTooSmall
from shoal.sim.faults import CONNECTION_MODES, METRICS_MODES, Faults
from shoal.sim.profiles import DEFAULT_PROFILE, PROFILES
from shoal.sim.server import Address, run_engines
from shoal.sim.startfail import EXIT_CODE as START_FAILURE_EXIT_CODE
from shoal.sim.startfail import start_failure_log

log = logging.getLogger("shoal.sim")

# vLLM flags that take a value and change nothing in a simulation.
IGNORED_VALUE_FLAGS = (
    ("-tp", "--tensor-parallel-size"),
    ("-pp", "--pipeline-parallel-size"),
    ("-dp", "--data-parallel-size"),
    ("-dpl", "--data-parallel-size-local"),
    ("-dpa", "--data-parallel-address"),
    ("-dpp", "--data-parallel-rpc-port"),
    ("-dpr", "--data-parallel-start-rank"),
    ("-dpn", "--data-parallel-rank"),
    ("--data-parallel-backend",),
    ("-dcp", "--decode-context-parallel-size"),
    ("--api-server-count",),
    ("--distributed-executor-backend",),
    ("--nnodes",),
    ("--node-rank",),
    ("--master-addr",),
    ("--master-port",),
    ("--dtype",),
    ("--tokenizer",),
    ("--chat-template",),
    ("--download-dir",),
    ("--load-format",),
    ("--kv-events-config",),
    ("--uvicorn-log-level",),
    ("--max-logprobs",),
    ("--generation-config",),
    ("--swap-space",),
    ("--quantization", "-q"),
    ("--revision",),
)
IGNORED_SWITCHES = (
    "--headless",
    "--enforce-eager",
    "--trust-remote-code",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-log-requests",
    "--disable-uvicorn-access-log",
    "--enable-expert-parallel",
    "--data-parallel-hybrid-lb",
    "--data-parallel-external-lb",
    "--disable-frontend-multiprocessing",
)


def human_int(text: str) -> int:
    """vLLM's human-readable ints: 1k = 1,000 and 1K = 1,024 (likewise m/M, g/G, t/T)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix:
        power = "kmgt".index(suffix.lower()) + 1
        number *= (1024 if suffix.isupper() else 1000) ** power
    return int(number)


def max_model_len(text: str) -> int | None:
    return None if text in ("auto", "-1") else human_int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    v = parser.add_argument_group("vLLM flags (vllm serve's meaning)")
    v.add_argument("model_tag", nargs="?", help="the model, as `vllm serve MODEL`")
    v.add_argument("--model", default=None, help="model path or id (the /v1/models root)")
    v.add_argument("--served-model-name", nargs="+", default=None)
    v.add_argument("--host", default=None, help="default 0.0.0.0")
    v.add_argument("--port", type=int, default=None, help="default 8000")
    v.add_argument("--max-model-len", type=max_model_len, default=None)
    v.add_argument("--max-num-seqs", type=int, default=None)
    v.add_argument("--max-num-batched-tokens", type=human_int, default=None)
    v.add_argument("--block-size", type=int, default=None)
    v.add_argument("--num-gpu-blocks-override", type=int, default=None)
    v.add_argument(
        "--gpu-memory-utilization", "--device-memory-utilization", type=float, default=0.92
    )
    v.add_argument("--kv-cache-memory-bytes", type=human_int, default=None)
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    v.add_argument(
        "--prefix-caching-hash-algo",
        choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
        default="sha256",
    )
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--enable-server-load-tracking", action="store_true")
    v.add_argument(
        "--shutdown-timeout",
        type=int,
        default=0,
        help="on SIGTERM, seconds to let requests in flight finish (new ones fail); 0 aborts",
    )
    v.add_argument(
        "--api-key", nargs="+", default=None, help="keys required on /v1 (else VLLM_API_KEY)"
    )
    for names in IGNORED_VALUE_FLAGS:
        v.add_argument(*names, default=None, help=argparse.SUPPRESS)
    for name in IGNORED_SWITCHES:
        v.add_argument(name, action="store_true", help=argparse.SUPPRESS)

    s = parser.add_argument_group("simulator flags")
    s.add_argument("--sim-profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE)
    s.add_argument(
        "--sim-time-scale",
        type=float,
        default=1.0,
        help="simulated seconds per real second (10 = ten times faster than real time)",
    )
    s.add_argument(
        "--sim-listen",
        action="append",
        type=Address.parse,
        default=[],
        metavar="IP:PORT",
        help="serve another independent engine here (repeatable)",
    )
    s.add_argument(
        "--sim-startup-seconds",
        type=float,
        default=0.0,
        help="simulated model load, connections refused meanwhile (slow start)",
    )
    s.add_argument(
        "--sim-stop-probability",
        type=float,
        default=0.0,
        help="chance per token of ending the output (finish_reason stop) unless ignore_eos",
    )
    s.add_argument("--sim-hang-after", type=float, default=None, metavar="SECONDS")
    s.add_argument("--sim-crash-after", type=float, default=None, metavar="SECONDS")
    s.add_argument("--sim-crash-exit-seconds", type=float, default=3.7, metavar="SECONDS")
    s.add_argument("--sim-error-rate", type=float, default=0.0)
    s.add_argument("--sim-slowness", type=float, default=1.0)
    s.add_argument("--sim-broken-metrics", choices=METRICS_MODES, default="ok")
    s.add_argument(
        "--sim-connections",
        choices=CONNECTION_MODES,
        default="ok",
        help="reset: answer every request (but /_sim/fault) with a TCP reset; "
        "silent: answer none of them",
    )
    s.add_argument(
        "--sim-poison",
        default="",
        metavar="TEXT",
        help="answer 500 to every request whose body holds TEXT (a request-specific error)",
    )
    s.add_argument(
        "--sim-stall-after",
        type=int,
        default=0,
        metavar="CHUNKS",
        help="streams stop after CHUNKS chunks and hang (0: off)",
    )
    s.add_argument(
        "--sim-fault-api",
        action="store_true",
        help="serve /_sim/fault to inject faults at run time",
    )
    s.add_argument(
        "--sim-load-model",
        action="store_true",
        help="read the model directory's files at start, as vLLM loads weights; exit 1, "
        "as vLLM does, when it holds no config.json",
    )
    s.add_argument(
        "--sim-hf-home",
        type=Path,
        metavar="DIR",
        help="with --sim-load-model and a Hub id: fetch the files this Hugging Face cache "
        "lacks from HF_ENDPOINT first (HF_TOKEN), as vLLM does with HF_HOME, then load them",
    )
    s.add_argument("--sim-log-level", default="INFO")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    model = args.model or args.model_tag or "meta-llama/Meta-Llama-3-8B-Instruct"
    return EngineConfig(
        model=model,
        served_model_names=tuple(args.served_model_name or ()),
        profile=PROFILES[args.sim_profile],
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo,
        enable_server_load_tracking=args.enable_server_load_tracking,
        seed=args.seed,
        api_keys=api_keys(args.api_key),
        shutdown_timeout=args.shutdown_timeout,
        time_scale=args.sim_time_scale,
        startup_seconds=args.sim_startup_seconds,
        stop_probability=args.sim_stop_probability,
        hang_after=args.sim_hang_after,
        crash_after=args.sim_crash_after,
        crash_exit_seconds=args.sim_crash_exit_seconds,
        fault_api=args.sim_fault_api,
        faults=Faults(
            error_rate=args.sim_error_rate,
            slowness=args.sim_slowness,
            metrics=args.sim_broken_metrics,
            connections=args.sim_connections,
            poison=args.sim_poison,
            stall_after=args.sim_stall_after,
        ),
    )


def addresses(args: argparse.Namespace) -> list[Address]:
    found: list[Address] = list(args.sim_listen)
    if args.port is not None or args.host is not None or not found:
        found.insert(0, Address(args.host or "0.0.0.0", 8000 if args.port is None else args.port))
    return found


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.sim_log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        config = engine_config(args)
    except KVCacheTooSmall as e:
        # The engine core's failure, as vLLM's log and exit code tell it.
        sys.stderr.write(start_failure_log(f"ValueError: {e}"))
        return START_FAILURE_EXIT_CODE
    except ValueError as e:
        log.error("%s", e)
        return 2
    if args.sim_load_model and not _load_model(config.model, hf_home=args.sim_hf_home):
        return 1
    # Each engine gets its own fault state.
    engines = [
        (dataclasses.replace(config, faults=dataclasses.replace(config.faults)), address)
        for address in addresses(args)
    ]
    return asyncio.run(_serve(engines))


def _load_model(model: str, *, hf_home: Path | None = None) -> bool:
    """Read every file of a local model directory (the weights' load); a Hub
    id with hf_home is fetched into that cache first."""
    directory = Path(model)
    if hf_home is not None and not directory.is_dir():
        found = _from_hub(model, hf_home)
        if found is None:
            return False
        directory = found
    if not (directory / "config.json").is_file():
        log.error(
            "ValueError: Invalid repository ID or local directory specified: %r "
            "(no config.json there)",
            model,
        )
        return False
    files = [path for path in sorted(directory.rglob("*")) if path.is_file()]
    size = sum(len(path.read_bytes()) for path in files)
    log.info("loaded model from %s: %d files, %d bytes", directory, len(files), size)
    return True


def _from_hub(repo: str, hf_home: Path) -> Path | None:
    # Loaded here only: the simulator needs no HTTP client otherwise.
    import httpx

    from shoal.download.hfcache import snapshot
    from shoal.download.hub import Hub, HubError

    try:
        with Hub(token=os.environ.get("HF_TOKEN") or None) as hub:
            directory, fetched = snapshot(hub, repo=repo, revision="main", hf_home=hf_home)
    except (HubError, httpx.HTTPError, OSError) as error:
        log.error("OSError: %s", error)
        return None
    log.info("%s: %d files fetched from the Hub into %s", repo, fetched, directory)
    return directory


async def _serve(engines: Sequence[tuple[EngineConfig, Address]]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with run_engines(engines, wait_ready=False) as servers:

        async def all_gone() -> None:
            for server in servers:
                await server.gone.wait()

        gone = asyncio.create_task(all_gone())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([gone, stopping], return_when=asyncio.FIRST_COMPLETED)
        crashed = gone.done()
        if not crashed:
            await asyncio.gather(*(s.drain() for s in servers if not s.gone.is_set()))
        for task in (gone, stopping):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    # Every engine crashed: exit non-zero, as vLLM does when its engine dies.
    return 1 if crashed else 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="simulated vLLM 0.32 engines (tests, demo, benchmarks)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
