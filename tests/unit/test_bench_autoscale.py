"""The autoscaling benchmark's pure parts: the day's shape and arrivals
(seeded, following the rate), replica-seconds, P99 TTFT over the ramps, the
medians over repeats and the issue's targets, and the timeline plotted."""

from __future__ import annotations

import math

import pytest

from shoal.bench.autoscale import (
    PhaseName,
    Request,
    arrivals,
    by_mode,
    day,
    following,
    length,
    phase_at,
    rate_at,
    replica_seconds,
    summarize,
    table_text,
    targets,
    timeline,
)

SECONDS = {
    PhaseName.QUIET: 10.0,
    PhaseName.RAMP: 20.0,
    PhaseName.PEAK: 10.0,
    PhaseName.FALL: 20.0,
    PhaseName.IDLE: 10.0,
}
DAY = day(quiet_rate=1.0, peak_rate=9.0, seconds=SECONDS)


def test_the_day_goes_quiet_ramp_peak_fall_idle_with_linear_ramps() -> None:
    assert [p.name for p in DAY] == list(PhaseName)
    assert length(DAY) == 70
    assert rate_at(DAY, 5) == 1
    assert rate_at(DAY, 20) == pytest.approx(5)  # halfway up the ramp
    assert rate_at(DAY, 35) == 9
    assert rate_at(DAY, 65) == 0
    assert phase_at(DAY, 45) is not None and phase_at(DAY, 45).name is PhaseName.FALL  # type: ignore[union-attr]
    assert phase_at(DAY, 70) is None


def test_arrivals_are_seeded_and_follow_the_rate() -> None:
    sent = arrivals(DAY, seed=3)
    assert sent == arrivals(DAY, seed=3)
    assert sent != arrivals(DAY, seed=4)
    peak = sum(1 for t in sent if 30 <= t < 40)
    quiet = sum(1 for t in sent if t < 10)
    assert 60 <= peak <= 120  # 90 expected
    assert quiet <= 25  # 10 expected
    assert not [t for t in sent if t >= 60]  # idle


def test_replica_seconds_integrate_the_count_until_the_end() -> None:
    assert replica_seconds([(0, 1), (10, 3), (20, 0)], end=30) == 10 + 30
    assert replica_seconds([(0, 2)], end=5) == 10


def test_a_fleet_following_demand_exactly_bounds_the_replica_seconds() -> None:
    demand = [(0.0, 0.0), (1.0, 2.0), (2.0, 7.0), (3.0, None), (4.0, 30.0), (5.0, 3.0)]
    counts = following(demand, target=3, most=4)
    assert counts == [(0.0, 0), (1.0, 1), (2.0, 3), (3.0, 3), (4.0, 4), (5.0, 1)]
    assert replica_seconds(counts, end=6.0) == 0 + 1 + 3 + 3 + 4 + 1


def test_the_summary_takes_the_ramps_p99_and_the_latency_from_zero() -> None:
    requests = [Request(sent=1, ttft=5.0)]  # quiet
    requests += [Request(sent=12 + i * 0.1, ttft=0.1) for i in range(50)]  # ramp
    requests += [Request(sent=31 + i * 0.1, ttft=0.05) for i in range(50)]  # peak
    requests += [Request(sent=33, ttft=None)]
    found = summarize("warm", requests, [(0, 0), (2, 1)], phases=DAY, from_zero=9.0)
    assert found.from_zero_ms == 9000
    assert found.p50_ttft_ms == pytest.approx(100)
    assert found.p99_ramp_ttft_ms == pytest.approx(100)
    assert found.failed == 1 and found.requests == 102
    assert found.replica_seconds == 68


def test_medians_over_repeats_and_the_targets_met_or_missed() -> None:
    def run(mode: str, ttft: float, replicas: int) -> object:
        return summarize(
            mode,
            [Request(sent=15, ttft=ttft), Request(sent=35, ttft=ttft)],
            [(0, replicas)],
            phases=DAY,
        )

    runs = [run("static", 0.1, 4), run("static", 0.3, 4)]
    runs += [run("warm", 0.12, 2), run("warm", 0.2, 2), run("cold", 0.5, 2)]
    table = by_mode(runs)  # type: ignore[arg-type]
    assert table["static"]["p99_ttft_ms"].median == pytest.approx(200)
    assert table["static"]["p99_ttft_ms"].runs == 2
    assert table["cold"]["p99_ttft_ms"].runs == 1
    met = {t.what: t for t in targets(table, static="static", warm="warm", cold="cold")}
    cost = met["replica-s, autoscaled / static"]
    assert cost.value == pytest.approx(0.5) and cost.met
    assert met["P99 TTFT during ramps, autoscaled / static"].met  # 160 / 200
    assert met["P99 TTFT, warm-gated / ungated"].met
    assert "| static | 2 |" in table_text(table)


def test_the_timeline_bins_load_replicas_and_p99() -> None:
    requests = [Request(sent=t * 0.5, ttft=0.2) for t in range(20)]  # 2 per second, 10 s
    bins = timeline(requests, [(0, 1), (5, 3)], end=10, bin_seconds=5)
    assert [b.offered for b in bins] == [2, 2]
    assert [b.replicas for b in bins] == [1, 3]
    assert bins[0].p99_ttft_ms == pytest.approx(200)
    empty = timeline([], [(0, 2)], end=5, bin_seconds=5)
    assert math.isnan(empty[0].p99_ttft_ms) and empty[0].replicas == 2
