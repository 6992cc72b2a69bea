"""A replica's error rate through the router: read from the routers' own
counters, over the interval between two checks, summed over router pods;
a trickle of requests gives no verdict."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from shoal.health.assess import HealthTracker, Outcome, Probe, Reason
from shoal.health.router_errors import Routed, RouterErrorWindow, parse_router_requests
from shoal.router.metrics import RouterMetrics


def scrape(counts: dict[tuple[str, str], int]) -> str:
    """A router's real /metrics text after these answers (replica, code) -> n."""
    metrics = RouterMetrics()
    metrics.retries.labels("connect_error").inc(7)
    metrics.inflight.labels("c-r0-0").set(3)
    for (replica, code), n in counts.items():
        metrics.requests.labels(replica, code).inc(n)
    return generate_latest(metrics.registry).decode()


def test_parse_counts_5xx_per_replica_and_leaves_out_the_router_and_gone_clients() -> None:
    text = scrape(
        {
            ("c-r0-0", "200"): 40,
            ("c-r0-0", "500"): 10,
            ("c-r0-0", "400"): 2,
            ("c-r0-0", "499"): 5,  # the client left: not the replica's doing
            ("c-r1-0", "200"): 3,
            ("none", "503"): 9,  # answered by the router itself
        }
    )
    assert parse_router_requests(text) == {"c-r0-0": Routed(52, 10), "c-r1-0": Routed(3, 0)}
    assert parse_router_requests("") == {}
    with pytest.raises(ValueError):
        parse_router_requests("shoal_router_requests_total{replica= oops\n")


def test_the_window_gives_what_each_replica_answered_since_the_last_round() -> None:
    window = RouterErrorWindow()
    # A router pod seen for the first time only sets its baseline.
    assert window.advance({"router-a": {"r0": Routed(100, 1)}}) == {}
    assert window.advance({"router-a": {"r0": Routed(130, 21)}}) == {"r0": Routed(30, 20)}
    # Nothing new: no entry.
    assert window.advance({"router-a": {"r0": Routed(130, 21)}}) == {}


def test_the_window_sums_router_pods_and_survives_failed_scrapes_and_restarts() -> None:
    window = RouterErrorWindow()
    window.advance({"a": {"r0": Routed(10, 0)}, "b": {"r0": Routed(50, 5), "r1": Routed(8, 0)}})
    moved = window.advance(
        {"a": {"r0": Routed(20, 4)}, "b": {"r0": Routed(60, 9), "r1": Routed(8, 0)}}
    )
    assert moved == {"r0": Routed(20, 8)}
    # b's scrape fails: its last counts stay, so the next scrape covers both rounds.
    assert window.advance({"a": {"r0": Routed(20, 4)}, "b": None}) == {}
    assert window.advance({"a": {"r0": Routed(20, 4)}, "b": {"r0": Routed(80, 9)}}) == {
        "r0": Routed(20, 0)
    }
    # a's process restarted (counters back near zero): they count from zero.
    assert window.advance({"a": {"r0": Routed(6, 6)}, "b": {"r0": Routed(80, 9)}}) == {
        "r0": Routed(6, 6)
    }
    # A router pod that went away is forgotten; coming back it starts a baseline.
    window.advance({"b": {"r0": Routed(80, 9)}})
    assert window.advance({"a": {"r0": Routed(100, 50)}, "b": {"r0": Routed(80, 9)}}) == {}


def _ok(at: float) -> Probe:
    return Probe(at=at, health=Outcome.OK, canary=Outcome.OK, progress=at, progress_during_canary=1)


def test_a_high_routed_error_rate_fails_the_check_only_past_the_minimum_requests() -> None:
    tracker = HealthTracker(
        stall_seconds=30, failure_threshold=2, error_rate_threshold=0.5, routed_min_requests=20
    )
    trickle = tracker.observe(_ok(1), routed=Routed(requests=5, errors=5))
    assert trickle.ok  # five failed requests of five: too few to say
    quiet = tracker.observe(_ok(2), routed=None)
    assert quiet.ok  # still five in the window
    below = tracker.observe(_ok(3), routed=Routed(requests=40, errors=19))
    assert below.ok
    first = tracker.observe(_ok(4), routed=Routed(requests=40, errors=21))
    assert (first.reason, first.unhealthy, first.connection_level) == (
        Reason.FAILING,
        False,
        False,
    )
    # Over the window of failure_threshold checks: 40 of 80.
    assert first.detail.startswith("50% of routed requests failed (40 of 80"), first.detail
    assert first.detail.endswith("over the last 2 checks)")
    second = tracker.observe(_ok(5), routed=Routed(requests=30, errors=27))
    assert second.unhealthy and second.consecutive == 2


def test_a_burst_of_errors_counts_while_the_breaker_starves_the_replica() -> None:
    """The router's breaker opens on the failing replica: no more requests
    reach it, yet the burst stays in the window for failure_threshold checks."""
    tracker = HealthTracker(stall_seconds=30, failure_threshold=3, routed_min_requests=10)
    burst = tracker.observe(_ok(1), routed=Routed(requests=12, errors=12))
    starved = [tracker.observe(_ok(t), routed=None) for t in (2, 3)]
    assert [a.reason for a in (burst, *starved)] == [Reason.FAILING] * 3
    assert starved[-1].unhealthy
    # Past the window, with the canary passing, it is healthy again.
    assert tracker.observe(_ok(4), routed=None).ok


def test_a_failing_canary_says_what_the_router_saw_too() -> None:
    tracker = HealthTracker(stall_seconds=30, failure_threshold=1, routed_min_requests=10)
    failed = Probe(
        at=0, health=Outcome.OK, canary=Outcome.ERROR, canary_status=500, progress_during_canary=0
    )
    verdict = tracker.observe(failed, routed=Routed(requests=10, errors=7))
    assert verdict.reason is Reason.FAILING
    assert verdict.detail.startswith("canary completion error 500; 70% of routed requests")


def test_a_router_scrape_with_a_nan_count_is_no_reading() -> None:
    text = (
        "# TYPE shoal_router_requests counter\n"
        'shoal_router_requests_total{code="500",replica="c-r0-0"} NaN\n'
    )
    with pytest.raises(ValueError, match="shoal_router_requests_total"):
        parse_router_requests(text)


@pytest.mark.parametrize(
    "counts",
    [
        # A negative count of requests: with both negative, 7 errors out of
        # 10 requests would read as a failing replica, to be restarted.
        {"200": -3.0, "500": -7.0},
        # Counts summing past the largest float: inf - inf is NaN next round.
        {"200": 1.7e308, "500": 1.7e308},
    ],
    ids=["negative", "summing past the largest float"],
)
def test_counts_no_router_can_have_are_no_reading(counts: dict[str, float]) -> None:
    text = "# TYPE shoal_router_requests counter\n" + "".join(
        f'shoal_router_requests_total{{code="{code}",replica="c-r0-0"}} {value!r}\n'
        for code, value in counts.items()
    )
    with pytest.raises(ValueError, match="shoal_router_requests_total"):
        parse_router_requests(text)
