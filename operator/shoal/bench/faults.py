"""`make bench-faults`: issue 17's measured targets, on simulated engines.

- Errors: one of three engines answers half its requests 500 for the whole
  run, under an open-loop load through a router on its default settings.
  Target: client-visible failures <= 0.5% of requests.
- Stall: one of three engines stops every stream after two chunks (its
  /health stays 200), for the whole run, with `stallSeconds` set short.
  Target: no client waits more than the stall deadline plus one retry: the
  longest request takes at most stallSeconds plus twice a healthy request's
  p99 (the stalled attempt's start, and the client's retry). Streams cut
  after their first byte cannot be retried by the router and are counted.

Each target runs `--repeats` times (fresh engines and router each time);
the report gives every run, the median and the spread (min to max), and is
written to bench-results/faults.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from shoal.bench.fault_matrix import Engines, Load, matrix_router, open_loop, settings_of
from shoal.bench.fault_plan import RequestOutcome
from shoal.bench.stats import percentile

ERROR_TARGET = 0.005
STALL_SECONDS = 2


def _load(front: str, *, load: Load, seconds: float) -> list[RequestOutcome]:
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        return asyncio.run(open_loop(front, load=load, started=time.perf_counter(), stop=stop))
    finally:
        timer.cancel()


def _router_counter(front: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(front + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def errors_run(tmp: Path, *, load: Load, seconds: float) -> dict[str, Any]:
    config: dict[str, Any] = {"replicaHeader": True}  # the defaults otherwise
    with Engines(tmp) as engines:
        engines.set_fault(0, error_rate=0.5)
        with matrix_router(engines, tmp, config=config, name="errors") as front:
            outcomes = _load(front, load=load, seconds=seconds)
            retries = _router_counter(front, "shoal_router_retries")
        flaky = engines.name(0)
    failed = [o for o in outcomes if not o.ok]
    served = [o for o in outcomes if o.ok]
    return {
        "requests": len(outcomes),
        "failed": len(failed),
        "failed_share": len(failed) / len(outcomes),
        "flaky_share": sum(o.replica == flaky for o in served) / max(len(served), 1),
        "retries": retries,
        "errors": sorted({(o.error or "")[:120] for o in failed})[:5],
    }


def stall_run(tmp: Path, *, load: Load, seconds: float) -> dict[str, Any]:
    config: dict[str, Any] = {"replicaHeader": True, "timeouts": {"stallSeconds": STALL_SECONDS}}
    with Engines(tmp) as engines:
        engines.set_fault(0, stall_after=2)
        with matrix_router(engines, tmp, config=config, name="stall") as front:
            outcomes = _load(front, load=load, seconds=seconds)
        stalled = engines.name(0)
    waits = [o.ended - o.sent for o in outcomes]
    healthy = [o.ended - o.sent for o in outcomes if o.ok and o.replica != stalled]
    healthy_p99 = percentile(healthy, 99)
    bound = settings_of(config).timeouts.stall_seconds + 2 * healthy_p99
    cut = [o for o in outcomes if not o.ok and o.replica == stalled and o.began]
    other = [o for o in outcomes if not o.ok and o not in cut]
    return {
        "requests": len(outcomes),
        "cut_mid_stream": len(cut),
        "failed_otherwise": len(other),
        "max_wait": max(waits),
        "p99_wait": percentile(waits, 99),
        "healthy_p99": healthy_p99,
        "bound": bound,
        "within": max(waits) <= bound,
    }


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def report(errors: list[dict[str, Any]], stalls: list[dict[str, Any]]) -> str:
    failed = _spread([r["failed_share"] for r in errors])
    share = _spread([r["flaky_share"] for r in errors])
    wait = _spread([r["max_wait"] for r in stalls])
    bound = _spread([r["bound"] for r in stalls])
    cut = _spread([r["cut_mid_stream"] for r in stalls])
    lines = [
        "## One of three engines at 50% errors (router defaults)",
        "",
        "| run | requests | failed | failed % | flaky engine's share | retries |",
        "|---|---|---|---|---|---|",
        *(
            f"| {i + 1} | {r['requests']} | {r['failed']} | {r['failed_share']:.2%} "
            f"| {r['flaky_share']:.1%} | {r['retries']:.0f} |"
            for i, r in enumerate(errors)
        ),
        "",
        f"Client-visible failures: median {failed['median']:.2%} (min {failed['min']:.2%}, "
        f"max {failed['max']:.2%}); target <= {ERROR_TARGET:.1%}: "
        f"{'met' if failed['median'] <= ERROR_TARGET else 'NOT met'}. The flaky engine's "
        f"share: median {share['median']:.1%} ({share['min']:.1%} to {share['max']:.1%}).",
        "",
        f"## One of three engines stalling every stream (stallSeconds {STALL_SECONDS})",
        "",
        "| run | requests | cut mid-stream | failed otherwise | max wait s | p99 wait s "
        "| healthy p99 s | bound s | within |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {i + 1} | {r['requests']} | {r['cut_mid_stream']} | {r['failed_otherwise']} "
            f"| {r['max_wait']:.2f} | {r['p99_wait']:.2f} | {r['healthy_p99']:.2f} "
            f"| {r['bound']:.2f} | {'yes' if r['within'] else 'NO'} |"
            for i, r in enumerate(stalls)
        ),
        "",
        f"Longest client wait: median {wait['median']:.2f} s (min {wait['min']:.2f}, max "
        f"{wait['max']:.2f}) against a bound of median {bound['median']:.2f} s (stall deadline "
        f"plus one retry); streams cut after their first byte: median {cut['median']:.0f} "
        f"({cut['min']:.0f} to {cut['max']:.0f}).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=40.0, help="load per run")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    load = Load(rate=args.rate, max_tokens=16)
    errors: list[dict[str, Any]] = []
    stalls: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for i in range(args.repeats):
            errors.append(errors_run(Path(tmp) / f"errors-{i}", load=load, seconds=args.seconds))
            print(f"errors run {i + 1}: {errors[-1]}", flush=True)
            stalls.append(stall_run(Path(tmp) / f"stall-{i}", load=load, seconds=args.seconds))
            print(f"stall run {i + 1}: {stalls[-1]}", flush=True)
    text = report(errors, stalls)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.md").write_text(text + "\n")
    (args.out / "faults.json").write_text(
        json.dumps({"errors": errors, "stall": stalls, "rate": args.rate}, indent=2) + "\n"
    )
    met = statistics.median(r["failed_share"] for r in errors) <= ERROR_TARGET and all(
        r["within"] for r in stalls
    )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
