"""`shoal bench compare` beside the peer routers (vllm-router, smg, from PyPI
into their own cached venv) and with several router replicas: kept short,
these check that every router gets the same fleet and workload and reports
in the same table, not which one is faster (benchmark runs say that)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from shoal.bench.driver import OpenLoop
from shoal.bench.local import FleetSpec, LocalFleet
from shoal.bench.measure import measure
from shoal.bench.peers import peers_venv
from shoal.bench.workloads import synthetic
from shoal.router.metrics import REQUESTS


def test_peers_run_beside_shoal_on_the_same_workload_and_report_their_versions(
    tmp_path: Path,
) -> None:
    # The first use installs the pinned peers (about a minute, cached after).
    peers_venv(log=tmp_path / "install.log")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "shoal.cli", "bench", "compare"),
            *("--replicas", "2", "--policies", "cache-aware"),
            *("--peers", "smg:cache_aware,vllm-router:power_of_two"),
            *("--workload", "shared-prefix", "--tenants", "3", "--num-requests", "16"),
            *("--rate", "20", "--sim-time-scale", "1", "--no-plot", "--output", "json"),
            *("--workdir", str(tmp_path / "runs")),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    results = {r["policy"]: r for r in report["results"]}
    assert list(results) == ["cache-aware", "smg:cache_aware", "vllm-router:power_of_two"]
    assert report["peers"] == {
        "smg": {"package": "smg", "version": "1.13.0"},
        "vllm-router": {"package": "vllm-router", "version": "0.1.17"},
    }
    assert results["smg:cache_aware"]["router"] == "smg"
    assert "--policy cache_aware" in " ".join(results["smg:cache_aware"]["router_flags"])
    for result in results.values():
        assert (result["completed"], result["failed"]) == (16, 0), result["errors"]
        # The engines' own counters: every router's requests reached the fleet.
        assert result["engine_requests"] == 16
        assert result["prefix_hit_rate"] > 0


def test_requests_are_split_at_random_among_router_replicas(tmp_path: Path) -> None:
    spec = FleetSpec(replicas=2)
    workload = synthetic("random", count=30)
    with LocalFleet(
        spec, policy="least-request", workdir=tmp_path / "fleet", router_replicas=3
    ) as fleet:
        assert len(set(fleet.routers)) == 3
        result, _ = asyncio.run(
            measure(
                fleet.routers,
                workload,
                model=spec.model,
                pacing=OpenLoop(rate=30, seed=0),
                engines=fleet.engines,
            )
        )
        answered = []
        for router in fleet.routers:
            metrics = httpx.get(router + "/metrics").text
            answered.append(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in metrics.splitlines()
                    if line.startswith(REQUESTS + "_total{") and 'code="200"' in line
                )
            )
    assert result["completed"] == 30
    assert sum(answered) == 30
    assert all(n >= 3 for n in answered), answered
