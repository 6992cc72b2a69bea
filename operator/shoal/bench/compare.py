"""`shoal bench compare`: the same seeded workload through each routing policy,
each time on a fresh fleet (cold caches, same profile and seed), at one rate
or over a sweep of rates, for one seed or several. A policy is one of shoal's
(`cache-aware`) or a peer router's (`smg:cache_aware`, see `peers.py`); every
one gets the same fleet, workload and arrival times, and `router_replicas`
routers of its kind behind a random split.

Runs go rate by rate, seed by seed, with the policies in turn inside each, so
a change in the machine's background load spreads over all policies rather
than landing on one. Pure helpers here take medians over seeds, find each
policy's knee and the targets' operating point from the results; the runs
themselves are in `run_compare`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib
import math
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shoal.api.router import RouterPolicy
from shoal.bench.deployed import fleet_router_config
from shoal.bench.driver import OpenLoop, Outcome
from shoal.bench.ideal import ideal_hit_rate
from shoal.bench.local import FleetSpec, LocalFleet
from shoal.bench.measure import measure
from shoal.bench.peers import PEERS, is_peer, parse_peer_policy
from shoal.bench.workloads import Workload
from shoal.procs import ProcessExited
from shoal.sim.profiles import PROFILES

# A policy's P99 TTFT may grow to this many times its idle value before the
# load counts as past its knee.
KNEE_FACTOR = 2.0


@dataclass(frozen=True, kw_only=True)
class ComparePlan:
    spec: FleetSpec
    policies: tuple[str, ...]  # shoal's, and peers' as "PEER:POLICY"
    rates: tuple[float, ...]
    # The workload for a rate and seed (its request count may depend on the rate).
    workload_for: Callable[[float, int], Workload]
    seeds: tuple[int, ...] = (0,)
    burstiness: float = 1.0
    # More spec.router fields (camelCase, as in a VLLMCluster) than the defaults.
    router: dict[str, Any] = field(default_factory=dict)
    router_replicas: int = 1
    request_timeout: float = 300.0


# Called with (policy, rate, seed, number of requests) when a run starts, and
# with each request's outcome as it ends.
RunStarted = Callable[[str, float, int, int], None]
OutcomeSeen = Callable[[Outcome], None]


def source_digest(package: str) -> str:
    """A short hash of a package's source: results name the router code they
    measured, which changes more often than the version number."""
    digest = hashlib.sha256()
    for path in sorted(Path(importlib.import_module(package).__path__[0]).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def profile_report(spec: FleetSpec) -> dict[str, Any]:
    profile = asdict(PROFILES[spec.profile])
    if spec.kv_blocks is not None:
        profile["num_gpu_blocks"] = spec.kv_blocks
    return {**profile, "fleet": spec.describe()}


def router_of(policy: str) -> dict[str, str]:
    """Which router runs a policy, at which version."""
    if is_peer(policy):
        peer = parse_peer_policy(policy)
        return {"router": peer.peer.name, "version": peer.peer.version}
    return {"router": "shoal", "version": source_digest("shoal.router")}


def run_compare(
    plan: ComparePlan,
    *,
    workdir: Path | None = None,
    on_start: RunStarted | None = None,
    on_outcome: OutcomeSeen | None = None,
    on_result: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """Every run of the plan; `on_result` is called with the results so far
    after each run (a long sweep keeps what it measured if it is stopped)."""
    profile = PROFILES[plan.spec.profile]
    workdir = workdir or Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    results: list[dict[str, Any]] = []
    workloads: dict[float, dict[int, dict[str, Any]]] = {}
    configs = {
        policy: fleet_router_config(plan.spec, policy=RouterPolicy(policy), router=plan.router)
        for policy in plan.policies
        if not is_peer(policy)
    }
    for rate in plan.rates:
        for seed in plan.seeds:
            workload = plan.workload_for(rate, seed)
            described = {
                **workload.params,
                "ideal_prefix_hit_rate": ideal_hit_rate(workload.requests, profile=profile),
            }
            workloads.setdefault(rate, {})[seed] = described
            spec = dataclasses.replace(plan.spec, seed=seed)
            for policy in plan.policies:
                if on_start is not None:
                    on_start(policy, rate, seed, len(workload.requests))
                name = f"{policy.replace(':', '-')}-{rate:g}-seed{seed}"
                fleet = LocalFleet(
                    spec,
                    policy=policy,
                    workdir=workdir / name,
                    router_config=configs.get(policy, {}),
                    router_replicas=plan.router_replicas,
                )
                with _started(fleet):
                    result, _ = asyncio.run(
                        measure(
                            fleet.routers,
                            workload,
                            model=spec.model,
                            pacing=OpenLoop(rate=rate, burstiness=plan.burstiness, seed=seed),
                            engines=fleet.engines,
                            time_scale=spec.time_scale,
                            request_timeout=plan.request_timeout,
                            run_timeout=3 * len(workload.requests) / rate + 60,
                            on_outcome=on_outcome,
                        )
                    )
                    flags = fleet.router_flags
                results.append(
                    {
                        "policy": policy,
                        "rate": rate,
                        "seed": seed,
                        **router_of(policy),
                        "router_flags": flags,
                        "router_replicas": plan.router_replicas,
                        "p50_ttft_ms": result["median_ttft_ms"],
                        "ideal_prefix_hit_rate": described["ideal_prefix_hit_rate"],
                        **result,
                    }
                )
                if on_result is not None:
                    on_result(results)
    single = len(plan.rates) == 1
    summary = over_seeds(results) if len(plan.seeds) > 1 else results
    shoal_policies = [p for p in plan.policies if not is_peer(p)]
    report: dict[str, Any] = {
        "profile": profile_report(plan.spec),
        "workload": describe_workload(workloads),
        "seeds": list(plan.seeds),
        "router_replicas": plan.router_replicas,
        # router.json as the operator writes it (but for the policy, per result).
        "router_config": (
            {k: v for k, v in configs[shoal_policies[0]].items() if k != "policy"}
            if shoal_policies
            else None
        ),
        "peers": {
            name: {"package": peer.package, "version": peer.version}
            for name, peer in PEERS.items()
            if any(p.startswith(name + ":") for p in plan.policies)
        },
        "sources": {"router": source_digest("shoal.router"), "sim": source_digest("shoal.sim")},
        "results": results,
    }
    if len(plan.seeds) > 1:
        report["summary"] = summary
    if not single:
        report["knees"] = knees(summary)
        report["operating_point"] = operating_point(summary)
    return report


@contextlib.contextmanager
def _started(fleet: LocalFleet, *, attempts: int = 2) -> Iterator[LocalFleet]:
    """The fleet, started; a start that timed out (a router slow to answer
    on a loaded machine) is tried once more before the sweep gives up."""
    for attempt in range(attempts):
        try:
            fleet.__enter__()
            break
        except (TimeoutError, ProcessExited):
            if attempt == attempts - 1:
                raise
    try:
        yield fleet
    finally:
        fleet.stop()


# Result fields whose median over seeds the summary gives.
SUMMED_UP = (
    "completed",
    "failed",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
    "request_throughput",
    "output_throughput",
    "prefix_hit_rate",
    "preemptions",
    "request_imbalance",
    "ideal_prefix_hit_rate",
    "engine_ttft_ms",
    "engine_queue_ms",
    "engine_prefill_ms",
    "outside_ttft_ms",
)


def over_seeds(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (policy, rate): the median over seeds of each figure, and
    the P99 TTFT's spread (lowest and highest seed). NaN figures (a run with
    no answers) are left out of a median rather than poisoning it."""
    grouped: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for result in results:
        grouped.setdefault((result["policy"], result["rate"]), []).append(result)
    rows = []
    for runs in grouped.values():
        row: dict[str, Any] = {
            k: runs[0][k] for k in ("policy", "rate", "router", "version", "router_replicas")
        }
        row["router_flags"] = runs[0].get("router_flags")
        row["seeds"] = [r["seed"] for r in runs]
        for key in SUMMED_UP:
            values = [
                float(v)
                for r in runs
                if isinstance(v := r.get(key), int | float) and not math.isnan(v)
            ]
            row[key] = statistics.median(values) if values else math.nan
        p99 = [r["p99_ttft_ms"] for r in runs if not math.isnan(r["p99_ttft_ms"])]
        row["p99_ttft_ms_min"] = min(p99, default=math.nan)
        row["p99_ttft_ms_max"] = max(p99, default=math.nan)
        groups = [r.get("groups") or {} for r in runs]
        if groups[0]:
            row["groups"] = {
                name: {
                    "p99_e2el_ms": statistics.median(
                        g[name]["p99_e2el_ms"] for g in groups if name in g
                    )
                }
                for name in groups[0]
            }
        rows.append(row)
    return rows


_PER_SEED = ("requests", "ideal_prefix_hit_rate")
_PER_RUN = ("seed", *_PER_SEED)


def describe_workload(described: dict[float, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """The report's workload section, from each run's (by rate, then seed):
    the parameters they share once, and what differs by rate (a sweep) and
    by seed: the requests and the ideal hit rate. Over several seeds the
    ideal is their median, as the tables give it."""
    first = next(iter(next(iter(described.values())).values()))
    common = {k: v for k, v in first.items() if k not in _PER_RUN}
    points = {rate: _workload_point(by_seed) for rate, by_seed in described.items()}
    if len(points) == 1:
        return {**common, **next(iter(points.values()))}
    return {**common, "per_rate": {f"{rate:g}": point for rate, point in points.items()}}


def _workload_point(by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    if len(by_seed) == 1:
        return {k: v for k, v in next(iter(by_seed.values())).items() if k in _PER_RUN}
    return {
        "requests": statistics.median(w["requests"] for w in by_seed.values()),
        "ideal_prefix_hit_rate": statistics.median(
            w["ideal_prefix_hit_rate"] for w in by_seed.values()
        ),
        "per_seed": {str(seed): {k: w[k] for k in _PER_SEED} for seed, w in by_seed.items()},
    }


def _by_policy(results: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        grouped.setdefault(result["policy"], []).append(result)
    for runs in grouped.values():
        runs.sort(key=lambda r: r["rate"])
    return grouped


def knee(runs: Sequence[dict[str, Any]], *, factor: float = KNEE_FACTOR) -> dict[str, Any]:
    """The highest rate before P99 TTFT first exceeds `factor` times its idle
    value (the P99 TTFT at the lowest rate swept). None when even the second
    rate is past it; the last rate when no rate is (the knee lies beyond)."""
    ordered = sorted(runs, key=lambda r: r["rate"])
    idle = ordered[0]["p99_ttft_ms"]
    limit = factor * idle
    best: float | None = ordered[0]["rate"]
    beyond = True
    for run in ordered:
        ttft = run["p99_ttft_ms"]
        if math.isnan(ttft) or ttft > limit or run["failed"] > 0:
            beyond = False
            break
        best = run["rate"]
    return {
        "knee_rate": best,
        "idle_p99_ttft_ms": idle,
        "limit_p99_ttft_ms": limit,
        "beyond_sweep": beyond,
    }


def knees(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {policy: knee(runs) for policy, runs in _by_policy(results).items()}


def operating_point(
    results: Sequence[dict[str, Any]], *, baseline: str = "round-robin"
) -> dict[str, Any] | None:
    """The lowest swept rate at which the baseline's P99 TTFT exceeds twice its
    P50 (where the targets are judged), with every policy's ratios to the
    baseline there."""
    grouped = _by_policy(results)
    runs = grouped.get(baseline)
    if not runs:
        return None
    point = next((r for r in runs if r["p99_ttft_ms"] > 2 * r["p50_ttft_ms"]), None)
    if point is None:
        return None
    rate = point["rate"]
    ratios = {}
    for policy, policy_runs in grouped.items():
        at = next((r for r in policy_runs if r["rate"] == rate), None)
        if at is None:
            continue
        ratios[policy] = {
            "p99_ttft_vs_baseline": at["p99_ttft_ms"] / point["p99_ttft_ms"],
            "output_throughput_vs_baseline": at["output_throughput"] / point["output_throughput"],
            "prefix_hit_rate": at.get("prefix_hit_rate"),
        }
    return {"baseline": baseline, "rate": rate, "ratios": ratios}
