"""Which replicas a fleet keeps, on plain data: a scale-down removes the
replica whose loss costs least (not serving, then the fewest requests in
flight), not the highest index; no other replica is renamed; a scale-up
fills the lowest free index, and keeps a replica still draining before it
makes a new one; without a removal order those not serving go first, then
the highest indices."""

from __future__ import annotations

from shoal.controller.autoscale import in_flight_by_replica, parse_router_demand
from shoal.controller.retire import (
    ReplicaLoad,
    kept_indices,
    order_text,
    parse_order,
    removal_order,
    replica_loads,
)


def test_the_replica_with_fewest_requests_in_flight_is_removed_first() -> None:
    loads = [
        ReplicaLoad(index=0, serving=True, in_flight=5),
        ReplicaLoad(index=1, serving=True, in_flight=1),
        ReplicaLoad(index=2, serving=True, in_flight=3),
    ]
    assert removal_order(loads) == [1, 2, 0]


def test_a_replica_not_serving_goes_before_any_serving_one_however_idle() -> None:
    loads = [
        ReplicaLoad(index=0, serving=True, in_flight=0),
        ReplicaLoad(index=1, serving=False, in_flight=2),  # warming, or draining already
        ReplicaLoad(index=2, serving=True, in_flight=0),
    ]
    assert removal_order(loads)[0] == 1


def test_equal_costs_remove_the_highest_index_first() -> None:
    loads = [ReplicaLoad(index=i, serving=True, in_flight=2) for i in range(4)]
    assert removal_order(loads) == [3, 2, 1, 0]


def test_a_scale_down_keeps_the_others_under_their_own_indices() -> None:
    assert kept_indices(count=2, existing=[0, 1, 2], order=[1, 2, 0]) == [0, 2]
    # Replica 1 drained and gone: the fleet stays as it is.
    assert kept_indices(count=2, existing=[0, 2], order=[1, 2, 0]) == [0, 2]


def test_without_an_order_the_highest_indices_are_removed() -> None:
    assert kept_indices(count=1, existing=[0, 1, 2], order=()) == [0]


def test_an_order_naming_gone_replicas_falls_back_to_the_highest_index() -> None:
    assert kept_indices(count=2, existing=[0, 2, 3], order=[1]) == [0, 2]


def test_a_scale_up_fills_the_lowest_free_indices() -> None:
    assert kept_indices(count=4, existing=[0, 2], order=[1]) == [0, 1, 2, 3]
    assert kept_indices(count=2, existing=[], order=()) == [0, 1]


def test_a_replica_still_draining_is_kept_again_before_a_new_one_is_made() -> None:
    # 3 -> 2 removes 1, which drains; back to 3 before it is gone: it stays.
    assert kept_indices(count=3, existing=[0, 1, 2], order=[1, 2, 0]) == [0, 1, 2]


def test_the_order_round_trips_through_its_annotation_and_skips_garbage() -> None:
    assert parse_order(order_text([2, 0, 1])) == (2, 0, 1)
    assert parse_order(" 3, x, -1,,4 ") == (3, 4)
    assert parse_order(None) == ()


ROUTER = """\
# TYPE shoal_router_inflight_requests gauge
shoal_router_inflight_requests{replica="c-r0-0"} 3.0
shoal_router_inflight_requests{replica="c-r2-0"} 1.0
"""


def test_loads_come_from_the_routers_in_flight_counts_and_the_replicas_states() -> None:
    scrape = parse_router_demand(ROUTER)
    in_flight = in_flight_by_replica({"a": scrape, "b": scrape, "c": None})
    statuses = [
        {"index": 0, "state": "Serving"},
        {"index": 1, "state": "Serving"},
        {"index": 2, "state": "Serving"},
        {"index": 3, "state": "Warming"},
    ]
    loads = replica_loads(statuses, in_flight, cluster="c")
    assert loads == [
        ReplicaLoad(index=0, serving=True, in_flight=6),
        ReplicaLoad(index=1, serving=True, in_flight=0),
        ReplicaLoad(index=2, serving=True, in_flight=2),
        ReplicaLoad(index=3, serving=False, in_flight=0),
    ]
    assert removal_order(loads) == [3, 1, 2, 0]


def test_without_the_autoscaler_replicas_not_serving_go_before_the_highest() -> None:
    # kubectl scale from 3 to 1 while replica 0 loads (a rollout, a restart):
    # before, the highest indices went whatever their state, so the two
    # serving replicas drained and nothing served until replica 0 was warm.
    from shoal.controller.reconcile import live_indices
    from tests.unit.controller_samples import spec_of
    from tests.unit.test_controller_decide import desired_for, pod_for, serving

    observed = serving(range(3), desired_for(3))
    observed.replicas[0].pods = [pod_for(0, ready=False, warmed=None)]
    assert live_indices(spec_of(replicas=1), observed, {}) == [1]
    assert live_indices(spec_of(replicas=2), observed, {}) == [1, 2]
    # All serving: the highest go, as before.
    assert live_indices(spec_of(replicas=1), serving(range(3), desired_for(3)), {}) == [0]


def test_a_removal_order_left_from_another_scale_does_not_drain_the_warm_replica() -> None:
    # The autoscaler ranked "0,1" once; since, an HPA (or kubectl scale) set
    # 2 -> 1 while replica 1 still loads: the ranking is not for this scale.
    from shoal.controller.reconcile import live_indices
    from tests.unit.controller_samples import spec_of
    from tests.unit.test_controller_decide import desired_for, pod_for, serving

    observed = serving(range(2), desired_for(2))
    observed.replicas[1].pods = [pod_for(1, ready=False, warmed=None)]
    spec = spec_of(replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 4})
    assert live_indices(spec, observed, {"serving.shoal.dev/removal-order": "0,1"}) == [0]
