"""The autoscaler's decision on plain data: replicas follow the demand within
the bounds and the windows, a load near a threshold does not flap, replicas
on the way count as capacity, and only idleness takes the fleet to its
minimum (zero included)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.controller.autoscale import (
    Demand,
    RouterDemand,
    ScaleDecision,
    ScaleMemory,
    ScalePolicy,
    ScaleReason,
    decide_scale,
    parse_router_demand,
    total_demand,
)
from shoal.controller.autoscaler import status_patch

POLICY = ScalePolicy(
    min_replicas=0,
    max_replicas=8,
    target=10,
    tolerance=0.1,
    up_window_seconds=0,
    down_window_seconds=60,
    idle_seconds=120,
)


def run(
    loads: Sequence[float | None],
    *,
    policy: ScalePolicy = POLICY,
    current: int = 1,
    start: float = 1000.0,
    step: float = 5.0,
    silent: int = 0,
    memory: ScaleMemory | None = None,
) -> list[ScaleDecision]:
    """The decisions of successive rounds, each applying the one before
    (silent: ready routers that did not answer, every round; memory: the
    rounds before, or a request just seen)."""
    memory = memory if memory is not None else ScaleMemory(last_active=start)
    decisions = []
    for i, load in enumerate(loads):
        arrived = load is not None and load > 0
        decision = decide_scale(
            policy,
            demand=Demand(requests=load, arrived=arrived, silent=silent),
            current=current,
            memory=memory,
            now=start + i * step,
        )
        decisions.append(decision)
        current, memory = decision.desired, decision.memory
    return decisions


def counts(decisions: list[ScaleDecision]) -> list[int]:
    return [d.desired for d in decisions]


def test_demand_above_the_target_scales_up_at_once_to_what_it_needs() -> None:
    decision = run([45])[0]
    assert (decision.desired, decision.reason) == (5, ScaleReason.SCALED_UP)
    assert "demand 45" in decision.message


def test_replicas_never_go_beyond_max_replicas() -> None:
    assert counts(run([500, 500])) == [8, 8]


def test_a_scale_down_waits_for_the_down_window() -> None:
    # 60 s window, a round every 5 s: the fleet stays at 5 for the window, then goes.
    decisions = run([50] + [20] * 14)
    assert counts(decisions)[:12] == [5] * 12
    assert decisions[1].reason is ScaleReason.STABILIZING
    assert counts(decisions)[13] == 2
    assert decisions[13].reason is ScaleReason.SCALED_DOWN


def test_a_short_spike_does_not_scale_up_within_the_up_window() -> None:
    policy = dataclasses.replace(POLICY, up_window_seconds=30)
    decisions = run([10, 50, 10, 10], policy=policy)
    assert counts(decisions) == [1, 1, 1, 1]
    sustained = run([10] + [50] * 8, policy=policy)
    assert counts(sustained)[-1] == 5  # held for the window, then up


def test_a_steady_load_near_a_threshold_does_not_flap() -> None:
    # 4 replicas at a target of 10: 38 to 42 is within the 10% tolerance.
    noisy = [38, 42, 39.5, 41, 40.5, 38.5, 42, 39] * 5
    decisions = run(noisy, current=4)
    assert set(counts(decisions)) == {4}
    assert ScaleReason.WITHIN_TOLERANCE in {d.reason for d in decisions}


def test_replicas_starting_or_warming_count_as_capacity_on_the_way() -> None:
    # spec.replicas is 4 while 3 of them warm: a queue of 40 asks for no more.
    decision = run([40], current=4)[0]
    assert decision.desired == 4


def test_any_demand_keeps_one_replica_until_idle_then_the_fleet_goes_to_zero() -> None:
    # Demand ends at once; 120 s idle at 5 s a round: 24 rounds of one replica.
    decisions = run([5] + [0] * 30, current=1)
    assert counts(decisions)[:24] == [1] * 24
    assert counts(decisions)[24] == 0
    assert decisions[24].reason is ScaleReason.IDLE
    assert counts(decisions)[-1] == 0


def test_idle_goes_to_min_replicas_not_below() -> None:
    policy = dataclasses.replace(POLICY, min_replicas=2)
    assert counts(run([60] + [0] * 40, policy=policy))[-1] == 2


def test_requests_counted_between_rounds_keep_the_fleet_from_idling() -> None:
    # Short requests that finish between scrapes show demand 0 but are counted.
    memory = ScaleMemory(last_active=0.0)
    current = 1
    for now in range(0, 600, 5):
        decision = decide_scale(
            POLICY,
            demand=Demand(requests=0, arrived=True),
            current=current,
            memory=memory,
            now=float(now),
        )
        current, memory = decision.desired, decision.memory
    assert current == 1


def test_a_request_at_zero_starts_one_replica_at_once() -> None:
    decision = run([1], current=0)[0]
    assert (decision.desired, decision.reason) == (1, ScaleReason.SCALED_UP)


def test_no_router_answering_changes_nothing() -> None:
    decisions = run([None] * 40, current=3)
    assert counts(decisions) == [3] * 40
    assert decisions[0].reason is ScaleReason.NO_SIGNAL


def test_a_ready_router_that_does_not_answer_holds_scale_downs_not_scale_ups() -> None:
    # The busy router of two is too slow to answer /metrics: the idle one's 0
    # is a lower bound of the demand, past the down window and idleSeconds.
    held = run([0] * 40, current=4, silent=1)
    assert counts(held) == [4] * 40
    assert held[-1].reason is ScaleReason.PARTIAL_SIGNAL
    assert "1 ready router did not answer" in held[-1].message, held[-1].message
    # What did answer asks for more: that much is known, so it scales up.
    up = run([60], current=4, silent=1)[0]
    assert (up.desired, up.reason) == (6, ScaleReason.SCALED_UP)
    # Once every router answers again, the down window counts from there.
    seen = counts(run([5] * 14, current=4, memory=held[-1].memory, start=1200.0))
    assert seen[:12] == [4] * 12 and seen[-1] == 1, seen


def test_replicas_set_outside_the_bounds_are_brought_back() -> None:
    policy = dataclasses.replace(POLICY, min_replicas=2, max_replicas=4)
    above = run([60], policy=policy, current=7)[0]
    assert (above.desired, above.reason) == (4, ScaleReason.OUT_OF_BOUNDS)
    below = run([None], policy=policy, current=0)[0]
    assert (below.desired, below.reason) == (2, ScaleReason.OUT_OF_BOUNDS)


def test_a_ramp_up_and_down_is_followed_within_bounds_and_windows() -> None:
    ramp = [5, 15, 30, 50, 80, 120, 80, 50, 30, 15, 5] + [5] * 20
    decisions = run(ramp)
    seen = counts(decisions)
    assert max(seen) == 8  # 120 asks for 12, max is 8
    assert seen[:6] == [1, 2, 3, 5, 8, 8]
    # Down only after the 60 s window past the peak (round 5).
    assert all(n == 8 for n in seen[5:17])
    assert seen[-1] == 1


ROUTER_METRICS = """\
# HELP shoal_router_inflight_requests Requests in flight, by replica.
# TYPE shoal_router_inflight_requests gauge
shoal_router_inflight_requests{replica="c-r0-0"} 3.0
shoal_router_inflight_requests{replica="c-r1-0"} 4.0
# HELP shoal_router_queue_depth Requests waiting for a replica.
# TYPE shoal_router_queue_depth gauge
shoal_router_queue_depth 2.0
# HELP shoal_router_requests Attempts answered.
# TYPE shoal_router_requests counter
shoal_router_requests_total{code="200",replica="c-r0-0"} 10.0
shoal_router_requests_total{code="503",replica="none"} 1.0
shoal_router_requests_created{code="200",replica="c-r0-0"} 1.7e9
"""


def test_demand_is_in_flight_plus_queued_summed_over_the_routers() -> None:
    one = parse_router_demand(ROUTER_METRICS)
    assert one == RouterDemand(
        in_flight=7, queued=2, answered=11, by_replica={"c-r0-0": 3, "c-r1-0": 4}
    )
    demand, counts_now = total_demand({"a": one, "b": one, "c": None}, {})
    assert demand == Demand(requests=18, arrived=False)  # first sight: a baseline only
    moved = RouterDemand(in_flight=0, queued=0, answered=12)
    demand, _ = total_demand({"a": moved, "b": one}, counts_now)
    assert demand == Demand(requests=9, arrived=True)


def test_only_a_ready_router_that_does_not_answer_is_silent() -> None:
    idle = RouterDemand(in_flight=0, queued=0, answered=5)
    demand, _ = total_demand({"a": None, "b": idle}, {}, ready={"a", "b"})
    assert demand == Demand(requests=0, arrived=False, silent=1)
    # A router not Ready takes no new request from the Service: its silence
    # (starting, crash-looping) says nothing of the demand.
    demand, _ = total_demand({"a": None, "b": idle}, {}, ready={"b"})
    assert demand == Demand(requests=0, arrived=False, silent=0)


def test_no_router_answering_is_no_signal() -> None:
    demand, _ = total_demand({"a": None}, {"a": 3.0})
    assert demand.requests is None


def test_a_first_round_without_load_waits_a_whole_down_window_before_scaling_down() -> None:
    # A new cluster (or a restarted operator) with no load yet: 60 s window at 5 s a round.
    policy = dataclasses.replace(POLICY, min_replicas=1)
    seen = counts(run([0] * 14, policy=policy, current=2, memory=ScaleMemory()))
    assert seen[:12] == [2] * 12
    assert seen[-1] == 1


def test_a_router_scrape_with_a_nan_or_infinite_count_is_no_demand_reading() -> None:
    # A NaN would make the replicas wanted NaN, which no count of replicas is.
    for value in ("NaN", "+Inf"):
        with pytest.raises(ValueError, match="shoal_router_inflight_requests"):
            parse_router_demand(ROUTER_METRICS.replace("} 3.0", "} " + value, 1))


_counts = st.one_of(
    st.floats(min_value=-1e308, max_value=1e308, allow_nan=False),
    st.integers(-5, 50).map(float),
    st.sampled_from([1e308, 1.7e308, -0.0]),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    routers=st.lists(
        st.tuples(_counts, _counts, _counts, _counts) | st.none(), min_size=1, max_size=4
    ),
    current=st.integers(0, 12),
)
def test_whatever_finite_counts_routers_report_the_decision_stays_within_bounds(
    routers: list[tuple[float, float, float, float] | None], current: int
) -> None:
    """Counts a router could not have (negative, or summing past the largest
    float) are no demand reading: before, two routers reporting 1e308 made
    the demand infinite and `recommend` raised OverflowError (the autoscaler
    round failed every time), and a negative in-flight count made the demand
    negative, which asked for one replica whatever the other routers saw."""
    scrapes: dict[str, RouterDemand | None] = {}
    for i, counts_ in enumerate(routers):
        if counts_ is None:
            scrapes[f"r{i}"] = None
            continue
        first, second, queued, answered = counts_
        text = (
            "# TYPE shoal_router_inflight_requests gauge\n"
            f'shoal_router_inflight_requests{{replica="c-r0-0"}} {first!r}\n'
            f'shoal_router_inflight_requests{{replica="c-r1-0"}} {second!r}\n'
            "# TYPE shoal_router_queue_depth gauge\n"
            f"shoal_router_queue_depth {queued!r}\n"
            "# TYPE shoal_router_requests counter\n"
            f'shoal_router_requests_total{{code="200",replica="c-r0-0"}} {answered!r}\n'
        )
        try:
            scrapes[f"r{i}"] = parse_router_demand(text)
        except ValueError:
            scrapes[f"r{i}"] = None
            # Refused only for what no router has.
            assert min(counts_) < 0 or math.isinf(first + second + queued), counts_
    demand, _ = total_demand(scrapes, {})
    assert demand.requests is None or 0 <= demand.requests < float("inf")
    decision = decide_scale(
        POLICY, demand=demand, current=current, memory=ScaleMemory(), now=1000.0
    )
    assert POLICY.min_replicas <= decision.desired <= POLICY.max_replicas


def test_a_fleet_at_zero_stays_there_when_a_restarted_operator_sees_no_demand() -> None:
    # An operator restart (a helm upgrade, a Lease failover) forgets when the
    # fleet was last active: at zero with nothing asked, there is nothing to
    # keep one replica for (before: every idle fleet started a replica, and
    # held it for idleSeconds).
    assert counts(run([0] * 30, current=0, memory=ScaleMemory())) == [0] * 30
    # A request at zero still starts one at once.
    assert counts(run([0, 3], current=0, memory=ScaleMemory())) == [0, 1]


def test_a_silent_router_does_not_wake_a_fleet_at_zero() -> None:
    # Its demand is unknown, not 0: it holds scale-downs, but starting a
    # replica is for demand someone saw (before: 0 -> 1 -> 0 each time one
    # router answered and the next round it did not).
    idle = ScaleMemory(last_active=0.0, started=0.0)
    assert counts(run([0] * 6, current=0, silent=1, memory=idle)) == [0] * 6


def test_a_router_that_misses_a_scrape_keeps_its_count_for_the_next() -> None:
    # Before: its count was forgotten, so the requests it answered between
    # the scrapes around the missed one were not seen, and steady short
    # requests through it read as idle.
    seen = RouterDemand(in_flight=0, queued=0, answered=5)
    later = RouterDemand(in_flight=0, queued=0, answered=8)
    other = RouterDemand(in_flight=0, queued=0, answered=1)
    _, counted = total_demand({"a": seen, "b": other}, {})
    _, counted = total_demand({"a": None, "b": other}, counted)
    demand, counted = total_demand({"a": later, "b": other}, counted)
    assert demand.arrived, demand
    assert counted == {"a": 8, "b": 1}
    # A router gone from the list (its pod deleted) is forgotten.
    _, counted = total_demand({"b": other}, counted)
    assert counted == {"b": 1}


def test_demand_after_a_stretch_with_no_reading_waits_a_whole_down_window() -> None:
    # Every router silent for longer than the down window, then a low
    # reading: the count as it was stands for the window, as on a first
    # round (before: the history had aged out, so it dropped in one round).
    seen = counts(run([40] + [None] * 20 + [5] * 14, current=1))
    assert seen[0] == 4 and set(seen[1:21]) == {4}
    assert seen[21:33] == [4] * 12, seen
    assert seen[-1] == 1


def test_a_first_status_write_nulls_what_an_earlier_operator_may_have_set() -> None:
    written = {"desiredReplicas": 2, "lastDecision": "Steady"}
    first = status_patch(None, written)
    assert first is not None and first["stoodAsideFor"] is None and first["demand"] is None
    assert {k: v for k, v in first.items() if v is not None} == written
    # After that, only what this process wrote and no longer sets.
    later = status_patch({**written, "demand": 3.0}, written)
    assert later == {**written, "demand": None}
    assert status_patch(written, None) is None
