"""`shoal demo`: the main job on a laptop with nothing but shoal installed.

Starts simulated vLLM engines and the router on loopback, drives a short
shared-prefix workload (tenants with long system prompts, users in
multi-turn chats) while a live view shows each replica's load, queue, KV
usage, prefix hits and share of the traffic, then replays the very same
workload against round-robin on a fresh fleet and ends with the comparison.
Every process it starts is stopped when it ends, however it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live

from shoal.api.router import RouterPolicy
from shoal.bench.cli import consoles
from shoal.bench.deployed import fleet_router_config
from shoal.bench.driver import OpenLoop, Outcome
from shoal.bench.engines import scrape
from shoal.bench.ideal import ideal_hit_rate
from shoal.bench.local import FleetSpec, LocalFleet
from shoal.bench.measure import measure
from shoal.bench.plot import plot_results
from shoal.bench.report import ideal_caption, results_table
from shoal.bench.workloads import Workload, synthetic
from shoal.demo.view import Snapshot, render
from shoal.engine.client import EngineClient
from shoal.engine.errors import EngineError
from shoal.router.metrics import LOAD_SCORE
from shoal.sim.profiles import DEFAULT_PROFILE, PROFILES


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="simulated engines behind the cache-aware router, live, then against round-robin",
        description="Start simulated vLLM engines and the router on loopback, drive a "
        "shared-prefix workload with a live per-replica view, then run the same workload "
        "through round-robin on a fresh fleet and compare. Takes about a minute.",
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument(
        "--duration", type=float, default=20.0, help="seconds of traffic per policy (default 20)"
    )
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--policy", default="cache-aware")
    parser.add_argument("--baseline", default="round-robin")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=Path("shoal-demo.png"))
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="do it through the operator on the testbed: helm install, kubectl apply a "
        "VLLMCluster, kubectl get vllmclusters, requests via the router (needs a checkout "
        "with the testbed built: make testbed)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _, console = consoles()
    if args.kubernetes:
        return _kubernetes_demo()
    workload = synthetic(
        "shared-prefix", count=max(1, math.ceil(args.rate * args.duration)), seed=args.seed
    )
    profile = PROFILES[args.profile]
    spec = FleetSpec(replicas=args.replicas, profile=args.profile, seed=args.seed)
    ideal = ideal_hit_rate(workload.requests, profile=profile)
    console.print(
        f"[bold]shoal demo[/]: {args.replicas} simulated engines ({profile.description}) "
        f"behind shoal's router, {len(workload.requests)} chat requests at {args.rate:g}/s: "
        f"{workload.params['tenants']} tenants with {workload.params['system_words']}-word "
        "system prompts, users in multi-turn conversations."
    )
    workdir = Path(tempfile.mkdtemp(prefix="shoal-demo-"))
    results: list[dict[str, Any]] = []
    try:
        for policy in (args.policy, args.baseline):
            config = fleet_router_config(spec, policy=RouterPolicy(policy))
            with LocalFleet(
                spec, policy=policy, workdir=workdir / policy, router_config=config
            ) as fleet:
                console.print(
                    f"\n[bold]{policy}[/]: engines {', '.join(fleet.engines)}; "
                    f"router {fleet.router}"
                )
                result = asyncio.run(
                    _drive_with_view(
                        fleet, workload, rate=args.rate, duration=args.duration, console=console
                    )
                )
            results.append(
                {"policy": policy, "rate": args.rate, "ideal_prefix_hit_rate": ideal, **result}
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    title = f"shoal demo: shared-prefix, {args.replicas} replicas, {args.rate:g} req/s"
    console.print()
    console.print(
        results_table(
            results,
            title=title,
            caption=ideal_caption(results),
        )
    )
    console.print(_verdict(results[0], results[1]))
    plot_results(results, args.plot, title=title)
    console.print(f"plot: {args.plot}")
    return 0 if all(r["completed"] for r in results) else 1


def _verdict(policy: dict[str, Any], baseline: dict[str, Any]) -> str:
    def ratio(key: str) -> str:
        base = baseline.get(key) or math.nan
        return f"{policy.get(key, math.nan) / base:.2f}x" if base else "-"

    return (
        f"{policy['policy']} vs {baseline['policy']}: P99 TTFT {ratio('p99_ttft_ms')}, "
        f"P50 TTFT {ratio('median_ttft_ms')}, output throughput {ratio('output_throughput')}, "
        f"prefix hits {policy.get('prefix_hit_rate', math.nan):.0%} vs "
        f"{baseline.get('prefix_hit_rate', math.nan):.0%}"
    )


def load_scores(text: str) -> dict[str, float]:
    """The router's load score per replica, keyed by the engine URL (static
    endpoints are named host:port)."""
    scores = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LOAD_SCORE:
                scores["http://" + sample.labels.get("replica", "")] = sample.value
    return scores


async def _router_scores(engine: EngineClient, router: str) -> Mapping[str, float]:
    try:
        response = await engine.get(router + "/metrics", deadline=1.0)
        return load_scores(response.text)
    except (EngineError, ValueError):
        return {}


async def _drive_with_view(
    fleet: LocalFleet, workload: Workload, *, rate: float, duration: float, console: Console
) -> dict[str, Any]:
    outcomes: list[Outcome] = []
    async with EngineClient() as engine:
        baseline = await scrape(engine, fleet.engines)
        run = asyncio.ensure_future(
            measure(
                fleet.router,
                workload,
                model=fleet.spec.model,
                pacing=OpenLoop(rate=rate, seed=fleet.spec.seed),
                engines=fleet.engines,
                request_timeout=120.0,
                run_timeout=3 * duration + 60,
                on_outcome=outcomes.append,
            )
        )
        started = time.monotonic()
        live = Live(console=console, refresh_per_second=4) if console.is_terminal else None
        snapshot: Snapshot | None = None
        with live if live is not None else contextlib.nullcontext():
            while True:
                engines, scores = await asyncio.gather(
                    scrape(engine, fleet.engines, deadline=1.0),
                    _router_scores(engine, fleet.router),
                )
                snapshot = Snapshot(
                    title=f"{fleet.policy}: live view",
                    elapsed=time.monotonic() - started,
                    duration=duration,
                    engines=engines,
                    baseline=baseline,
                    load_scores=scores,
                    outcomes=list(outcomes),
                )
                if live is not None:
                    live.update(render(snapshot))
                if run.done():
                    break
                await asyncio.wait([run], timeout=0.5)
        if live is None and snapshot is not None:
            console.print(render(snapshot))
        result, _ = await run
    return result


def _kubernetes_demo() -> int:
    """The demo through the operator lives with the testbed it runs on
    (hack/demo.sh in a checkout: it starts a private testbed, installs the
    chart, applies a VLLMCluster, sends traffic and cleans up)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "hack" / "demo.sh"
    if not script.exists():
        print("shoal demo --kubernetes needs a shoal checkout (hack/demo.sh and the testbed).")
        return 2
    return subprocess.run(["bash", str(script)], check=False).returncode
