"""`shoal bench`, `shoal bench compare` and `shoal demo` on loopback fleets of
simulated engines, kept short: these check that the numbers are there and
sane, that failures are counted and that nothing is left running; how fast
routing makes things is measured by benchmark runs, not here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal.bench.driver import ClosedLoop, Replay, drive
from shoal.bench.ideal import ideal_hit_rate
from shoal.bench.local import FleetSpec, LocalFleet
from shoal.bench.trace import load_trace
from shoal.bench.workloads import synthetic
from shoal.sim.profiles import PROFILES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def shoal(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_bench_reports_latency_throughput_and_engine_counters(tmp_path: Path) -> None:
    spec = FleetSpec(replicas=2)
    with LocalFleet(spec, policy="cache-aware", workdir=tmp_path / "fleet") as fleet:
        done = shoal(
            "bench",
            "--url",
            fleet.router,
            "--engines",
            ",".join(fleet.engines),
            "--workload",
            "shared-prefix",
            "--tenants",
            "3",
            "--rate",
            "10",
            "--num-requests",
            "40",
            "--output",
            "json",
            "--plot",
            str(tmp_path / "run.png"),
            "--save",
            str(tmp_path / "run.json"),
        )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert json.loads((tmp_path / "run.json").read_text()) == report
    assert report["model"] == spec.model
    result = report["result"]
    assert (result["completed"], result["failed"]) == (40, 0)
    assert result["total_output_tokens"] == 40 * 64, "every answer has the asked length"
    assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"] < result["p99_e2el_ms"]
    assert 0 < result["p50_itl_ms"] <= result["p99_itl_ms"]
    assert result["output_throughput"] == pytest.approx(
        result["total_output_tokens"] / result["duration"]
    )
    assert 2 < result["request_throughput"] < 15, "about the offered 10 requests/s"
    # The engines' own books agree with the client's.
    assert result["engine_requests"] == 40
    assert sum(r["requests"] for r in result["replicas"]) == 40
    assert sum(result["routed"].values()) == 40 and len(result["routed"]) == 2
    workload = synthetic("shared-prefix", count=40, tenants=3)
    ideal = ideal_hit_rate(workload.requests, profile=PROFILES[spec.profile])
    assert 0.2 < result["prefix_hit_rate"] <= ideal + 1e-9
    # Where the time to first token went, from the engines' histograms: the
    # simulator's is its queue plus its prefill, and the client saw more.
    assert result["engine_queue_ms"] >= 0 and result["engine_prefill_ms"] > 0
    assert result["engine_queue_ms"] + result["engine_prefill_ms"] == pytest.approx(
        result["engine_ttft_ms"]
    )
    assert result["outside_ttft_ms"] > 0, "the client saw more than the engines"
    assert (tmp_path / "run.png").read_bytes()[:8] == PNG_MAGIC


def test_bench_counts_the_errors_of_a_failing_engine(tmp_path: Path) -> None:
    """Straight at an engine failing half its requests (the router would retry
    them elsewhere, and the bench would see none)."""
    spec = FleetSpec(replicas=1, sim_args=("--sim-fault-api",))
    with LocalFleet(spec, policy="round-robin", workdir=tmp_path / "fleet") as fleet:
        httpx.post(fleet.engines[0] + "/_sim/fault", json={"error_rate": 0.5}).raise_for_status()
        done = shoal(
            "bench",
            "--url",
            fleet.engines[0],
            "--engines",
            fleet.engines[0],
            "--workload",
            "random",
            "--rate",
            "20",
            "--num-requests",
            "30",
            "--output",
            "json",
            "--no-plot",
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["result"]
    assert result["failed"] > 0 and result["completed"] > 0
    assert result["failed"] + result["completed"] == 30
    assert any(error.startswith("HTTP 500") for error in result["errors"])


def test_replay_follows_the_trace_and_closed_loop_caps_concurrency(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 50 + 0.3 * i, "prompt": f"q{i} hello", "output_tokens": 8})
            + "\n"
            for i in range(8)
        )
    )
    workload = load_trace(trace)
    with LocalFleet(FleetSpec(replicas=2), policy="least-request", workdir=tmp_path) as fleet:
        replayed = asyncio.run(
            drive(fleet.router, workload.requests, model="shoal-sim", pacing=Replay())
        )
        closed = asyncio.run(
            drive(
                fleet.router,
                synthetic("random", count=12).requests,
                model="shoal-sim",
                pacing=ClosedLoop(concurrency=3),
            )
        )
    assert all(o.ok for o in replayed.outcomes + closed.outcomes)
    for outcome, request in zip(replayed.outcomes, workload.requests, strict=True):
        assert request.at is not None
        assert outcome.sent == pytest.approx(request.at, abs=0.15)
    # At any moment at most 3 requests were in flight.
    events = sorted(
        [(o.sent, 1) for o in closed.outcomes]
        + [(o.sent + (o.latency or 0.0), -1) for o in closed.outcomes]
    )
    in_flight = peak = 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    assert peak == 3


def _results(report: dict[str, Any]) -> dict[tuple[str, float], dict[str, Any]]:
    return {(r["policy"], r["rate"]): r for r in report["results"]}


def test_compare_runs_each_policy_on_the_same_workload(tmp_path: Path) -> None:
    done = shoal(
        "bench",
        "compare",
        "--workload",
        "shared-prefix",
        "--tenants",
        "4",
        "--replicas",
        "2",
        "--policies",
        "round-robin,cache-aware",
        "--rate",
        "8",
        "--duration",
        "3",
        # Engines twice as fast as real time: rates and latencies are in
        # engine time, so the numbers below must not change with the scale.
        "--sim-time-scale",
        "2",
        "--output",
        "json",
        "--plot",
        str(tmp_path / "compare.png"),
        "--workdir",
        str(tmp_path / "runs"),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["profile"]["name"] == "h100-llama3-8b"
    assert report["profile"]["fleet"]["replicas"] == 2
    assert report["profile"]["fleet"]["time_scale"] == 2.0
    assert report["router_config"]["scrapeIntervalMilliseconds"] == 125
    assert report["workload"]["requests"] == 24 and report["workload"]["tenants"] == 4
    ideal = report["workload"]["ideal_prefix_hit_rate"]
    assert 0 < ideal < 1
    results = _results(report)
    assert set(results) == {("round-robin", 8.0), ("cache-aware", 8.0)}
    for result in results.values():
        assert (result["completed"], result["failed"]) == (24, 0)
        assert result["p50_ttft_ms"] == result["median_ttft_ms"] <= result["p99_ttft_ms"]
        assert 4 < result["request_throughput"] < 12, "about the offered 8 per engine second"
        assert 0 < result["prefix_hit_rate"] <= ideal + 1e-9
        assert result["ideal_prefix_hit_rate"] == ideal
        # On engine time too, the client saw more than the engines. How much
        # more has no bound: the router, HTTP and the client are on the
        # machine's time, which a loaded machine stretches (a cold CI run:
        # 38.8 ms outside against the engines' 38.4).
        assert result["outside_ttft_ms"] > 0 and result["engine_ttft_ms"] > 0
    # Each run had fresh engines: its counters start from zero (cold caches).
    assert all(r["engine_requests"] == 24 for r in results.values())
    assert results[("round-robin", 8.0)]["request_imbalance"] == pytest.approx(1.0)
    assert (tmp_path / "compare.png").read_bytes()[:8] == PNG_MAGIC
    engines = {r["url"] for result in results.values() for r in result["replicas"]}
    for url in engines:
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=1)


def test_compare_sweep_finds_knees(tmp_path: Path) -> None:
    done = shoal(
        "bench",
        "compare",
        "--workload",
        "long-tail",
        "--replicas",
        "2",
        "--policies",
        "round-robin,least-request",
        "--sweep",
        "--rates",
        "4,8",
        "--duration",
        "2",
        "--sim-time-scale",
        "1",
        "--save",
        str(tmp_path / "sweep.json"),
        "--plot",
        str(tmp_path / "sweep.png"),
    )
    assert done.returncode == 0, done.stderr
    assert "knee" in done.stdout and "round-robin" in done.stdout
    report = json.loads((tmp_path / "sweep.json").read_text())
    assert set(_results(report)) == {
        (p, r) for p in ("round-robin", "least-request") for r in (4.0, 8.0)
    }
    assert set(report["knees"]) == {"round-robin", "least-request"}
    for knee in report["knees"].values():
        assert knee["knee_rate"] in (None, 4.0, 8.0)
    assert set(report["workload"]["per_rate"]) == {"4", "8"}
    for result in report["results"]:
        assert set(result["groups"]) == {"short", "long"}
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_MAGIC


def test_demo_runs_briefly_compares_and_leaves_nothing_behind(tmp_path: Path) -> None:
    done = shoal(
        "demo",
        "--replicas",
        "2",
        "--duration",
        "5",
        "--rate",
        "8",
        "--plot",
        str(tmp_path / "demo.png"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "cache-aware vs round-robin: P99 TTFT" in out
    assert "replica 0" in out and "replica 1" in out, "the per-replica view was shown"
    assert (tmp_path / "demo.png").read_bytes()[:8] == PNG_MAGIC
    urls = set(re.findall(r"http://127\.0\.0\.1:\d+", out))
    assert len(urls) >= 3, "engines and router of the fleets"
    for url in urls:
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=1)
    ports = {url.rsplit(":", 1)[1] for url in urls}
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "shoal.cli" in args and any(f":{port}" in args for port in ports):
            leftovers.append(args)
    assert not leftovers
