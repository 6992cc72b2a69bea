"""`shoal probe`: the operator's health checks against one engine, printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from shoal.engine.client import EngineClient
from shoal.engine.errors import EngineError
from shoal.health.assess import HealthTracker
from shoal.health.probe import probe


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="run the operator's health, canary and stall checks against one engine",
        description="What the operator sees: /health, a max_tokens=1 canary under a deadline, "
        "and token progress. A canary that times out while no token is generated means a "
        "hung engine (vLLM's /health still answers 200 then). Exits non-zero when unhealthy.",
    )
    parser.add_argument("--endpoint", required=True, help="engine URL, e.g. http://10.0.0.5:8000")
    parser.add_argument("--model", help="served model name (default: the engine's first)")
    parser.add_argument("--watch", action="store_true", help="probe every --interval seconds")
    parser.add_argument("--interval", type=float, default=10.0)
    # Defaults for a real engine: the tier's real vLLM (CPU) answers the canary
    # in well under a second; a stopped engine core is called hung one canary
    # deadline after the probe starts (tests/vllm/test_probe_real.py).
    parser.add_argument(
        "--health-timeout", type=float, default=5.0, help="deadline of /health and /metrics (s)"
    )
    parser.add_argument(
        "--canary-timeout",
        type=float,
        default=10.0,
        help="deadline of the max_tokens=1 canary (s); a miss is a hang only while no token "
        "is generated meanwhile, so a busy engine is not called hung",
    )
    parser.add_argument("--stall-seconds", type=float, default=60.0)
    parser.add_argument(
        "--failure-threshold",
        type=int,
        default=1,
        help="consecutive failures before the verdict is unhealthy",
    )
    parser.add_argument("--count", type=int, default=0, help="with --watch: stop after N probes")
    parser.add_argument("--output", choices=["text", "json"], default="text")
    parser.set_defaults(func=run)


async def _run(args: argparse.Namespace) -> int:
    tracker = HealthTracker(
        stall_seconds=args.stall_seconds, failure_threshold=args.failure_threshold
    )
    endpoint = args.endpoint.rstrip("/")
    healthy = True
    rounds = 0
    async with EngineClient() as engine:
        model = args.model
        while True:
            started = time.monotonic()
            model = model or await _default_model(engine, endpoint, args.health_timeout)
            result = await probe(
                engine,
                endpoint,
                model=model,
                health_timeout=args.health_timeout,
                canary_timeout=args.canary_timeout,
            )
            verdict = tracker.observe(result)
            healthy = not verdict.unhealthy
            _print(
                args.output,
                result.health.value,
                result.canary.value,
                verdict.reason.value,
                verdict.detail,
                healthy,
                result.progress_during_canary,
                result.running,
            )
            rounds += 1
            if not args.watch or (args.count and rounds >= args.count):
                return 0 if healthy else 1
            await asyncio.sleep(max(args.interval - (time.monotonic() - started), 0.0))


async def _default_model(engine: EngineClient, endpoint: str, deadline: float) -> str | None:
    """The engine's first served model; None (no canary this round) when it
    does not say."""
    try:
        models = await engine.models(endpoint, deadline=deadline)
    except EngineError:
        return None
    return models[0] if models else None


def _print(
    output: str,
    health: str,
    canary: str,
    reason: str,
    detail: str,
    healthy: bool,
    progress: float | None,
    running: float,
) -> None:
    if output == "json":
        print(
            json.dumps(
                {
                    "health": health,
                    "canary": canary,
                    "reason": reason,
                    "detail": detail,
                    "healthy": healthy,
                    "progressDuringCanary": progress,
                    "running": running,
                }
            ),
            flush=True,
        )
        return
    verdict = "healthy" if healthy else "UNHEALTHY"
    print(
        f"health={health} canary={canary} running={running:.0f} "
        f"progress_during_canary={progress if progress is not None else 'n/a'} "
        f"-> {reason} ({detail}): {verdict}",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130
