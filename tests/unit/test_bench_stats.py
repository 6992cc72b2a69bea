"""Benchmark summaries: statistics under vllm bench serve's names, engine
counters turned into hit rates, work shares and the parts of the time to
first token, knees and the operating point of a sweep, and the demo's live
view, all from plain data."""

from __future__ import annotations

import math
import random
import re

import numpy
import pytest
from rich.console import Console

from shoal.bench.cli import json_safe
from shoal.bench.compare import describe_workload, knee, knees, operating_point
from shoal.bench.driver import Outcome
from shoal.bench.engines import fleet_report
from shoal.bench.report import ttft_table
from shoal.bench.stats import by_group, errors, percentile, routed, summarize
from shoal.demo.cli import load_scores
from shoal.demo.view import Snapshot, client_line, replica_rows
from shoal.engine.metrics import MetricsSnapshot


def _done(index: int, *, ttft: float, latency: float, tokens: int, group: str = "all") -> Outcome:
    return Outcome(
        index=index,
        group=group,
        ok=True,
        ttft=ttft,
        latency=latency,
        itls=[(latency - ttft) / (tokens - 1)] * (tokens - 1),
        prompt_tokens=100,
        output_tokens=tokens,
        replica=f"r{index % 2}",
    )


def test_percentiles_interpolate_as_numpy_does() -> None:
    rng = random.Random(0)
    for size in (1, 2, 5, 101, 1000):
        values = [rng.expovariate(1.0) for _ in range(size)]
        for p in (0, 50, 90, 99, 100):
            assert percentile(values, p) == pytest.approx(float(numpy.percentile(values, p)))
    assert math.isnan(percentile([], 50))


def test_summary_uses_vllm_bench_names_and_counts_only_completed() -> None:
    outcomes = [
        _done(0, ttft=0.1, latency=1.1, tokens=11),
        _done(1, ttft=0.3, latency=2.3, tokens=21),
        Outcome(index=2, group="all", error="HTTP 500: boom", replica="r0"),
    ]
    summary = summarize(outcomes, duration=4.0)
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["total_output_tokens"] == 32
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(8.0)
    assert summary["total_token_throughput"] == pytest.approx((200 + 32) / 4)
    assert summary["median_ttft_ms"] == pytest.approx(200.0)
    assert summary["mean_ttft_ms"] == pytest.approx(200.0)
    assert summary["p99_ttft_ms"] == pytest.approx(100 + 200 * 0.99)
    assert summary["mean_tpot_ms"] == pytest.approx(100.0)  # 1 s over 10 tokens, 2 s over 20
    assert summary["p99_itl_ms"] == pytest.approx(100.0)
    assert summary["p99_e2el_ms"] == pytest.approx(1100 + 1200 * 0.99)
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            assert f"{stat}_{name}_ms" in summary
    assert errors(outcomes) == {"HTTP 500: boom": 1}
    assert routed(outcomes) == {"r0": 2, "r1": 1}


def test_groups_are_summarised_apart_only_when_there_are_several() -> None:
    outcomes = [
        _done(0, ttft=0.01, latency=0.2, tokens=5, group="short"),
        _done(1, ttft=2.0, latency=30.0, tokens=500, group="long"),
    ]
    groups = by_group(outcomes, duration=30.0, groups=("short", "long"))
    assert groups["short"]["p99_e2el_ms"] == pytest.approx(200.0)
    assert groups["long"]["completed"] == 1
    assert by_group(outcomes, duration=30.0, groups=("all",)) == {}


def test_empty_run_summary_is_nan_not_an_error() -> None:
    summary = summarize([Outcome(index=0, group="all", error="refused")], duration=1.0)
    assert summary["completed"] == 0 and summary["failed"] == 1
    assert math.isnan(summary["p99_ttft_ms"])


def test_fleet_report_is_the_runs_delta_with_shares_and_a_missing_replica() -> None:
    before = {
        "a": MetricsSnapshot(prefix_queries=100, prefix_hits=50, requests=10),
        "b": MetricsSnapshot(),
        "c": None,  # did not answer
    }
    after = {
        "a": MetricsSnapshot(prefix_queries=1100, prefix_hits=850, requests=40, preemptions=1),
        "b": MetricsSnapshot(prefix_queries=1000, prefix_hits=200, requests=10),
        "c": MetricsSnapshot(requests=5),
    }
    report = fleet_report(before, after)
    assert report["prefix_hit_rate"] == pytest.approx(1000 / 2000)
    assert report["preemptions"] == 1
    replicas = {r["url"]: r for r in report["replicas"]}  # type: ignore[attr-defined]
    assert replicas["a"]["request_share"] == pytest.approx(0.75)
    assert replicas["a"]["prefix_hit_rate"] == pytest.approx(0.8)
    assert replicas["b"]["prefill_share"] == pytest.approx(800 / 1000)
    assert replicas["c"] == {"url": "c", "scraped": False}
    assert report["request_imbalance"] == pytest.approx(1.5)


def test_fleet_report_says_where_the_engines_spent_the_time_to_first_token() -> None:
    before = {
        "a": MetricsSnapshot(ttft_seconds=9, ttft_count=9, queue_seconds=5, queue_count=9),
        "b": MetricsSnapshot(),
    }
    after = {
        "a": MetricsSnapshot(
            ttft_seconds=9.3,
            ttft_count=12,
            queue_seconds=5.1,
            queue_count=11,
            prefill_seconds=0.08,
        ),
        "b": MetricsSnapshot(
            ttft_seconds=0.1, ttft_count=1, queue_seconds=0.02, queue_count=2, prefill_seconds=0.07
        ),
    }
    report = fleet_report(before, after)
    # Over the run only: 4 first tokens in 0.4 s, 4 ended requests.
    assert report["engine_ttft_ms"] == pytest.approx(100.0)
    assert report["engine_queue_ms"] == pytest.approx(30.0)
    assert report["engine_prefill_ms"] == pytest.approx(37.5)


def test_ttft_table_shows_each_runs_parts_and_nothing_without_engines() -> None:
    assert ttft_table([{"policy": "x", "mean_ttft_ms": 3.0}]) is None
    assert ttft_table([{"policy": "x", "engine_ttft_ms": math.nan}]) is None
    runs = [
        {
            "policy": "cache-aware",
            "rate": rate,
            "mean_ttft_ms": 31.8,
            "engine_ttft_ms": 30.5,
            "engine_queue_ms": 2.31,
            "engine_prefill_ms": 28.19,
            "outside_ttft_ms": 1.3,
            "seeds": [0, 1],
        }
        for rate in (15.0, 30.0)
    ]
    table = ttft_table(runs)
    assert table is not None
    console = Console(record=True, width=200)
    console.print(table)
    shown = console.export_text()
    assert "15/s" in shown and "30/s" in shown
    assert "median over seeds" in shown, "medians of the parts need not add up to the mean's"
    assert re.search(r"cache-aware\W+15/s\W+31\.8\W+2\.3\W+28\.2\W+1\.3\W", shown), shown


def _run(
    policy: str, rate: float, p50: float, p99: float, **extra: float
) -> dict[str, float | str]:
    return {
        "policy": policy,
        "rate": rate,
        "p50_ttft_ms": p50,
        "p99_ttft_ms": p99,
        "failed": 0,
        "output_throughput": 100 * rate,
        **extra,
    }


def test_knee_is_the_last_rate_before_p99_doubles_its_idle_value() -> None:
    runs = [
        _run("x", 2, 10, 100),
        _run("x", 4, 10, 150),
        _run("x", 8, 10, 190),
        _run("x", 16, 10, 250),
        _run("x", 32, 10, 120),  # back under the limit: the knee was already passed
    ]
    assert knee(runs)["knee_rate"] == 8
    assert not knee(runs)["beyond_sweep"]
    calm = [_run("y", 2, 10, 100), _run("y", 4, 10, 110)]
    assert knee(calm) == {
        "knee_rate": 4,
        "idle_p99_ttft_ms": 100,
        "limit_p99_ttft_ms": 200,
        "beyond_sweep": True,
    }
    failing = [_run("z", 2, 10, 100), {**_run("z", 4, 10, 110), "failed": 3}]
    assert knee(failing)["knee_rate"] == 2, "a rate with failed requests is past the knee"
    assert set(knees(runs + calm)) == {"x", "y"}


def _described(seed: int, ideal: float) -> dict[str, object]:
    return {
        "name": "shared-prefix",
        "requests": 300,
        "seed": seed,
        "tenants": 48,
        "ideal_prefix_hit_rate": ideal,
    }


def test_a_workload_over_several_seeds_is_described_by_each_not_by_the_first() -> None:
    one = describe_workload({15.0: {0: _described(0, 0.82)}})
    assert one == _described(0, 0.82)
    seeds = describe_workload(
        {15.0: {s: _described(s, i) for s, i in ((0, 0.82), (1, 0.85), (2, 0.83))}}
    )
    assert "seed" not in seeds and seeds["tenants"] == 48 and seeds["requests"] == 300
    # The median over seeds, as the tables' caption says, not seed 0's.
    assert seeds["ideal_prefix_hit_rate"] == 0.83
    assert seeds["per_seed"]["1"] == {"requests": 300, "ideal_prefix_hit_rate": 0.85}
    sweep = describe_workload(
        {r: {0: _described(0, r / 100), 1: _described(1, r / 50)} for r in (4.0, 8.0)}
    )
    assert set(sweep["per_rate"]) == {"4", "8"} and "ideal_prefix_hit_rate" not in sweep
    assert sweep["per_rate"]["8"]["ideal_prefix_hit_rate"] == pytest.approx(0.12)
    assert set(sweep["per_rate"]["8"]["per_seed"]) == {"0", "1"}


def test_operating_point_is_where_the_baseline_tail_first_doubles_its_median() -> None:
    results = [
        _run("round-robin", 2, 100, 150),
        _run("round-robin", 4, 100, 260),
        _run("cache-aware", 2, 50, 80, prefix_hit_rate=0.9),
        _run("cache-aware", 4, 50, 65, prefix_hit_rate=0.9),
    ]
    point = operating_point(results)
    assert point is not None and point["rate"] == 4
    assert point["ratios"]["cache-aware"]["p99_ttft_vs_baseline"] == pytest.approx(65 / 260)
    assert point["ratios"]["round-robin"]["p99_ttft_vs_baseline"] == 1.0
    assert operating_point(results[2:]) is None, "no baseline, no operating point"


def test_live_view_rows_show_each_replicas_share_since_the_run_began() -> None:
    baseline = {"http://h:1": MetricsSnapshot(requests=100), "http://h:2": MetricsSnapshot()}
    now = {
        "http://h:1": MetricsSnapshot(
            requests=130, prefix_queries=100, prefix_hits=90, running=3, kv_usage=0.5
        ),
        "http://h:2": None,
    }
    snapshot = Snapshot(
        title="t",
        elapsed=3.0,
        duration=10.0,
        engines=now,
        baseline=baseline,
        load_scores={"http://h:1": 0.31},
        outcomes=[_done(0, ttft=0.05, latency=0.5, tokens=10), Outcome(index=1, group="all")],
    )
    first, second = replica_rows(snapshot)
    assert first[1:7] == ("0.31", "3", "0", "50%", "90%", "30")
    assert first[7].endswith("100%")
    assert second[-1] == "no metrics"
    assert "answered 1, failed 1" in client_line(snapshot)
    assert "p50 50 ms" in client_line(snapshot)


def test_router_load_scores_are_keyed_by_engine_url() -> None:
    text = (
        "# TYPE shoal_router_load_score gauge\n"
        'shoal_router_load_score{replica="127.0.0.1:8001"} 0.25\n'
        'shoal_router_requests_total{replica="127.0.0.1:8001",code="200"} 3.0\n'
    )
    assert load_scores(text) == {"http://127.0.0.1:8001": 0.25}


def test_json_results_have_no_nan() -> None:
    report = {"p99_ttft_ms": math.nan, "replicas": [{"prefix_hit_rate": math.nan}], "ok": 1.5}
    assert json_safe(report) == {
        "p99_ttft_ms": None,
        "replicas": [{"prefix_hit_rate": None}],
        "ok": 1.5,
    }
