"""Which probe results count as failures, and when a replica must restart."""

from __future__ import annotations

from shoal.engine.metrics import MetricsSnapshot
from shoal.health.assess import HealthTracker, Outcome, Probe, Reason
from shoal.health.router_errors import Routed


def tracker(threshold: int = 3) -> HealthTracker:
    return HealthTracker(stall_seconds=30, failure_threshold=threshold)


def healthy(at: float, tokens: float = 100.0, running: float = 0.0) -> Probe:
    return Probe(
        at=at,
        health=Outcome.OK,
        canary=Outcome.OK,
        running=running,
        progress=tokens,
        progress_during_canary=1.0,
    )


def test_hung_engine_answers_health_but_not_the_canary() -> None:
    t = tracker()
    hung = Probe(
        at=0,
        health=Outcome.OK,
        canary=Outcome.TIMEOUT,
        running=3,
        progress=50,
        progress_during_canary=0,
    )
    results = [t.observe(hung) for _ in range(3)]
    assert [r.reason for r in results] == [Reason.HUNG] * 3
    assert [r.unhealthy for r in results] == [False, False, True]
    assert not results[-1].connection_level


def test_busy_engine_with_a_late_canary_is_not_restarted() -> None:
    t = tracker(threshold=1)
    busy = Probe(
        at=0,
        health=Outcome.OK,
        canary=Outcome.TIMEOUT,
        running=200,
        progress=5000,
        progress_during_canary=900,
    )
    assert t.observe(busy).ok


def test_stall_needs_running_requests_and_flat_tokens_for_the_window() -> None:
    t = tracker(threshold=1)
    assert t.observe(healthy(0, tokens=10, running=4)).ok
    assert t.observe(healthy(20, tokens=10, running=4)).ok  # flat for 20s < 30s
    stalled = t.observe(healthy(31, tokens=10, running=4))
    assert stalled.reason is Reason.STALLED and stalled.unhealthy
    assert t.observe(healthy(40, tokens=11, running=4)).ok  # progress resets it
    idle = tracker(threshold=1)
    for at in (0, 100, 200):  # idle engines generate nothing, rightly
        assert idle.observe(healthy(at, tokens=10, running=0)).ok


def test_dead_engine_is_connection_level_and_one_success_resets_the_count() -> None:
    t = tracker()
    refused = t.observe(Probe(at=0, health=Outcome.REFUSED, metrics_ok=False))
    assert refused.reason is Reason.DEAD and refused.connection_level
    dying = t.observe(Probe(at=1, health=Outcome.ERROR, health_status=503, metrics_ok=False))
    assert dying.reason is Reason.DEAD and not dying.connection_level and dying.consecutive == 2
    assert t.observe(healthy(2)).consecutive == 0


def test_health_unanswered_in_time_is_connection_level_too() -> None:
    # What a replica looks like from an operator whose packets to it are
    # dropped (a blackholed route), or whose own event loop is starved: not
    # an answer of the engine's (before: taken as the engine dead, so every
    # replica went out of rotation at once).
    late = tracker().observe(Probe(at=0, health=Outcome.TIMEOUT, metrics_ok=False))
    assert late.reason is Reason.DEAD and late.connection_level


def test_failing_requests_and_broken_metrics_count() -> None:
    t = tracker(threshold=1)
    failing = t.observe(
        Probe(
            at=0,
            health=Outcome.OK,
            canary=Outcome.ERROR,
            canary_status=500,
            progress=1,
            progress_during_canary=0,
        )
    )
    assert failing.reason is Reason.FAILING and "500" in failing.detail
    routed = tracker(threshold=1).observe(healthy(0), routed=Routed(25, 20))
    assert routed.reason is Reason.FAILING and "80%" in routed.detail
    assert "20 of 25" in routed.detail
    blind = tracker(threshold=1).observe(
        Probe(at=0, health=Outcome.OK, canary=Outcome.OK, metrics_ok=False)
    )
    assert blind.reason is Reason.METRICS


def test_an_engine_stepping_through_a_long_prefill_is_not_hung() -> None:
    # One prompt of a million tokens prefills for minutes in chunks that take
    # each step's whole budget: nothing is generated, the canary waits, but
    # the engine steps. Before, only generated tokens counted as progress,
    # so such an engine was restarted as hung (and the prompt retried on
    # the next replica, to the same end).
    before = MetricsSnapshot(running=1, generation_tokens=500, steps=40)
    after = MetricsSnapshot(running=1, generation_tokens=500, steps=52)
    assert after.progress > before.progress
    t = tracker(threshold=1)
    prefilling = Probe(
        at=0,
        health=Outcome.OK,
        canary=Outcome.TIMEOUT,
        running=1,
        progress=after.progress,
        progress_during_canary=after.progress - before.progress,
    )
    assert t.observe(prefilling).ok
    stopped = MetricsSnapshot(running=1, generation_tokens=500, steps=52)
    assert stopped.progress - after.progress == 0  # an engine that stopped: flat
