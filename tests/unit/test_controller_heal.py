"""Self-healing decisions: an unhealthy leader goes out of rotation and its
whole group is restarted; backoff between restarts of one replica; past the
restart budget it stays out, unrestarted, and the cluster is Degraded; at
most maxUnavailable down at once; two or more replicas failing at once on
connection-level errors restart none; a fleet of one is still healed; pods on
a lost node are force-deleted."""

from __future__ import annotations

from dataclasses import replace

from shoal.api.status import ConditionStatus
from shoal.controller.decide import (
    Decision,
    Desired,
    HealPolicy,
    Memory,
    NotReadyNodes,
    Probes,
    decide,
    health_targets,
    node_not_ready_since,
    out_for_health,
    restart_wait,
)
from shoal.controller.observe import ContainerFacts, Observed, ReplicaFacts
from shoal.health.assess import Assessment, Reason
from tests.unit.test_controller_decide import NOW, desired_for, pod_for, serving, set_for

POLICY = HealPolicy(
    backoff_initial_seconds=10,
    backoff_max_seconds=60,
    max_restarts=3,
    window_seconds=600,
)
HUNG = Assessment(Reason.HUNG, "canary timed out and no token was generated meanwhile", 3, 3, False)
REFUSED = Assessment(Reason.DEAD, "/health refused", 3, 3, True)
REFUSED_ONCE = Assessment(Reason.DEAD, "/health refused", 1, 3, True)
ONCE = Assessment(Reason.HUNG, "canary timed out", 1, 3, False)
OK = Assessment(Reason.HEALTHY, "passed", 0, 3, False)


def healing(replicas: int, *, max_unavailable: int = 1, tensor: int = 4) -> Desired:
    desired = desired_for(replicas, max_unavailable=max_unavailable, tensor=tensor)
    return replace(desired, heal=POLICY)


def run(
    desired: Desired,
    observed: Observed,
    memory: Memory | None = None,
    now: float = NOW,
    **health: Assessment,
) -> Decision:
    probes = Probes(health={f"uid-c-r{k[1:]}-0": v for k, v in health.items()})
    return decide(
        desired=desired, observed=observed, probes=probes, memory=memory or Memory(), now=now
    )


def test_an_unhealthy_leader_goes_out_of_rotation_and_its_group_restarts() -> None:
    desired = healing(2)
    decision = run(desired, serving(range(2), desired), r1=HUNG)
    [gate] = decision.gates
    assert (gate.pod.name, gate.status, gate.reason) == ("c-r1-0", False, "EngineHung")
    assert [p.name for p in decision.delete_pods] == ["c-r1-0"]
    assert decision.restarts[1].startswith("EngineHung")
    assert [e.reason for e in decision.events] == ["ReplicaRestarted"]
    assert decision.memory.restart_times == {1: (NOW,)}


def test_failures_below_the_threshold_and_healthy_replicas_are_left_alone() -> None:
    desired = healing(2)
    decision = run(desired, serving(range(2), desired), r0=OK, r1=ONCE)
    assert not decision.gates and not decision.delete_pods and not decision.restarts


def test_a_fleet_of_one_is_healed_even_on_connection_errors() -> None:
    desired = healing(1)
    decision = run(desired, serving(range(1), desired), r0=REFUSED)
    assert [p.name for p in decision.delete_pods] == ["c-r0-0"]


def test_a_multi_node_group_restarts_whole() -> None:
    desired = healing(1, tensor=16)
    pods = [pod_for(0), pod_for(0, role="worker", rank=0)]
    replica = ReplicaFacts(
        index=0,
        leader=set_for(0, desired),
        worker=set_for(0, desired, role="worker"),
        pods=pods,
    )
    decision = run(desired, Observed(replicas={0: replica}, router=None), r0=HUNG)
    assert sorted(p.name for p in decision.delete_pods) == ["c-r0-0", "c-r0-w-0"]


def test_backoff_doubles_between_restarts_of_one_replica_up_to_its_maximum() -> None:
    assert restart_wait((), POLICY, now=NOW) == 0
    assert restart_wait((NOW - 4,), POLICY, now=NOW) == 6  # 10s after the first
    assert restart_wait((NOW - 30, NOW - 4), POLICY, now=NOW) == 16  # 20s after the second
    long = replace(POLICY, max_restarts=10)
    assert restart_wait(tuple(NOW - 500 + i for i in range(6)), long, now=NOW) == 0  # 60s cap
    desired = healing(2)
    waiting = Memory(restart_times={1: (NOW - 4,)})
    decision = run(desired, serving(range(2), desired), waiting, r1=HUNG)
    assert not decision.delete_pods
    assert [g.status for g in decision.gates] == [False]  # out of rotation meanwhile
    assert decision.requeue_seconds == 6
    later = run(desired, serving(range(2), desired), decision.memory, NOW + 6, r1=HUNG)
    assert [p.name for p in later.delete_pods] == ["c-r1-0"]


def test_past_the_restart_budget_the_replica_stays_out_unrestarted_and_degraded() -> None:
    desired = healing(2)
    spent = Memory(restart_times={1: (NOW - 300, NOW - 200, NOW - 100)})
    decision = run(desired, serving(range(2), desired), spent, r1=HUNG)
    assert not decision.delete_pods and not decision.restarts
    assert [(g.pod.name, g.status) for g in decision.gates] == [("c-r1-0", False)]
    assert decision.degraded is not None and decision.degraded[0] == "RestartBudgetExhausted"
    assert [e.reason for e in decision.events] == ["RestartBudgetExhausted"]
    # Out of rotation for good: the admission path does not take it back.
    observed = serving(range(2), desired)
    observed.replicas[1].pods[0] = replace(
        observed.replicas[1].pods[0], warmed=ConditionStatus.FALSE
    )
    again = run(desired, observed, decision.memory, NOW + 1, r1=HUNG)
    assert not again.gates and not again.delete_pods and not again.events
    assert again.degraded is not None
    # Outside the window the budget is back.
    fresh = run(desired, serving(range(2), desired), spent, NOW + 1000, r1=HUNG)
    assert [p.name for p in fresh.delete_pods] == ["c-r1-0"]


def test_at_most_max_unavailable_replicas_restart_at_once() -> None:
    desired = healing(3, max_unavailable=1)
    decision = run(desired, serving(range(3), desired), r0=HUNG, r2=HUNG)
    assert [p.name for p in decision.delete_pods] == ["c-r0-0"]
    # Both are out of rotation; r2 waits for r0 to come back.
    assert sorted((g.pod.name, g.status) for g in decision.gates) == [
        ("c-r0-0", False),
        ("c-r2-0", False),
    ]
    assert 2 in decision.unhealthy
    wider = run(healing(3, max_unavailable=2), serving(range(3), desired), r0=HUNG, r2=HUNG)
    assert sorted(p.name for p in wider.delete_pods) == ["c-r0-0", "c-r2-0"]


def test_a_replica_down_for_another_reason_does_not_hold_a_restart_back() -> None:
    # Replica 0 loads, or waits for GPUs (scaled past them): restarting the
    # hung replica 1, out of rotation already, costs no serving capacity.
    # Before, it was never restarted while replica 0 was not Ready.
    desired = healing(2, max_unavailable=1)
    observed = serving(range(2), desired)
    observed.replicas[0].pods[0] = replace(observed.replicas[0].pods[0], ready=False)
    decision = run(desired, observed, r1=HUNG)
    assert [p.name for p in decision.delete_pods] == ["c-r1-0"]


def test_a_replica_restarted_for_its_health_holds_the_next_until_it_serves() -> None:
    desired = healing(3, max_unavailable=1)
    observed = serving(range(3), desired)
    first = run(desired, observed, r0=HUNG)
    assert [p.name for p in first.delete_pods] == ["c-r0-0"]
    # Its new pod loads; replica 2 hangs meanwhile: it waits.
    observed.replicas[0].pods[0] = replace(
        observed.replicas[0].pods[0], uid="uid-new", ready=False, warmed=None
    )
    second = run(desired, observed, first.memory, NOW + 1, r2=HUNG)
    assert not second.delete_pods and 2 in second.unhealthy
    # Replica 0 serves again: replica 2's turn.
    observed.replicas[0].pods[0] = replace(observed.replicas[0].pods[0], ready=True)
    third = run(desired, observed, second.memory, NOW + 2, r2=HUNG)
    assert [p.name for p in third.delete_pods] == ["c-r2-0"]


def test_many_replicas_failing_at_once_on_connection_errors_restart_none() -> None:
    desired = healing(3, max_unavailable=3)
    decision = run(desired, serving(range(3), desired), r0=REFUSED, r1=REFUSED, r2=OK)
    assert not decision.delete_pods and not decision.gates and not decision.restarts
    assert decision.degraded is not None and decision.degraded[0] == "ManyReplicasUnreachable"
    # Hung (answering, not connection-level) replicas are still healed.
    hung = run(desired, serving(range(3), desired), r0=HUNG, r1=HUNG)
    assert sorted(p.name for p in hung.delete_pods) == ["c-r0-0", "c-r1-0"]


def test_replicas_failing_together_are_left_alone_though_they_reach_the_threshold_apart() -> None:
    desired = healing(3, max_unavailable=3)
    observed = serving(range(3), desired)
    # r0 reached failureThreshold; r1's first connection-level failure is in.
    first = run(desired, observed, r0=REFUSED, r1=REFUSED_ONCE, r2=OK)
    assert not first.delete_pods and not first.gates and not first.restarts
    assert first.degraded is not None and first.degraded[0] == "ManyReplicasUnreachable"
    assert "replicas 0, 1 fail at once" in first.degraded[1]
    assert [e.reason for e in first.events] == ["ManyReplicasUnreachable"]
    assert first.memory.unreachable == {0, 1}
    # Still so on the next pass: no second Event, still no restart.
    again = run(desired, observed, first.memory, NOW + 1, r0=REFUSED, r1=REFUSED, r2=OK)
    assert not again.delete_pods and not again.events and again.degraded is not None
    # The network came back: no longer Degraded, nothing restarted.
    back = run(desired, observed, again.memory, NOW + 2, r0=OK, r1=OK, r2=OK)
    assert back.degraded is None and not back.delete_pods and not back.memory.unreachable
    # One replica alone failing on connection errors is still restarted.
    alone = run(desired, observed, back.memory, NOW + 3, r0=REFUSED, r2=OK)
    assert [p.name for p in alone.delete_pods] == ["c-r0-0"]


def refused(consecutive: int) -> Assessment:
    return Assessment(Reason.DEAD, "/health refused", consecutive, 3, True)


def test_the_last_of_a_shared_outage_to_recover_is_not_restarted_for_the_outage() -> None:
    # Seen in CI: the network came back to r0 a check before r1, so r1 failed
    # alone for a moment, past failureThreshold, and was restarted.
    desired = healing(3, max_unavailable=3)
    observed = serving(range(3), desired)
    out = run(desired, observed, None, NOW, r0=refused(5), r1=refused(5), r2=OK)
    assert out.memory.unreachable == {0, 1}
    back = run(desired, observed, out.memory, NOW + 1, r0=OK, r1=refused(6), r2=OK)
    assert not back.delete_pods and not back.restarts and not back.gates
    assert back.degraded is None
    # Still down after failureThreshold more checks on its own: restarted then.
    later = run(desired, observed, back.memory, NOW + 2, r0=OK, r1=refused(8), r2=OK)
    assert not later.delete_pods
    alone = run(desired, observed, later.memory, NOW + 3, r0=OK, r1=refused(9), r2=OK)
    assert [p.name for p in alone.delete_pods] == ["c-r1-0"]
    # One that recovered is judged afresh next time.
    well = run(desired, observed, back.memory, NOW + 2, r0=OK, r1=OK, r2=OK)
    assert not well.memory.after_outage
    again = run(desired, observed, well.memory, NOW + 3, r0=OK, r1=refused(3), r2=OK)
    assert [p.name for p in again.delete_pods] == ["c-r1-0"]


def test_a_replica_out_of_rotation_that_recovers_is_admitted_again() -> None:
    desired = healing(2)
    observed = serving(range(2), desired)
    observed.replicas[1].pods[0] = replace(
        observed.replicas[1].pods[0], warmed=ConditionStatus.FALSE, ready=False
    )
    memory = Memory(sick=frozenset({1}), restart_times={1: (NOW - 4,)})
    probes = Probes(healthy={"uid-c-r1-0": True}, health={"uid-c-r1-0": OK})
    decision = decide(desired=desired, observed=observed, probes=probes, memory=memory, now=NOW)
    assert [(g.pod.name, g.status) for g in decision.gates] == [("c-r1-0", True)]
    assert decision.memory.sick == frozenset()


def test_without_a_heal_policy_nothing_is_restarted() -> None:
    desired = desired_for(2)
    decision = run(desired, serving(range(2), desired), r1=HUNG)
    assert not decision.delete_pods and not decision.gates


def test_health_checks_admitted_leaders_and_those_out_for_health_only() -> None:
    desired = healing(3)
    observed = serving(range(3), desired)
    observed.replicas[1].pods[0] = replace(observed.replicas[1].pods[0], warmed=None)
    observed.replicas[2].pods[0] = replace(
        observed.replicas[2].pods[0], warmed=ConditionStatus.FALSE
    )
    names = [p.name for p in health_targets(observed, wanted={0, 1, 2}, nodes=1, sick=frozenset())]
    assert names == ["c-r0-0"]  # r1 warming, r2 out for another reason
    names = [
        p.name for p in health_targets(observed, wanted={0, 1, 2}, nodes=1, sick=frozenset({2}))
    ]
    assert names == ["c-r0-0", "c-r2-0"]


def _node(name: str, ready: str, since: str) -> dict[str, object]:
    condition = {"type": "Ready", "status": ready, "lastTransitionTime": since}
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


def test_pods_on_a_node_not_ready_past_node_loss_seconds_are_force_deleted() -> None:
    nodes = [
        _node("node-0-0", "True", "2026-01-01T00:00:00Z"),
        _node("node-1-0", "Unknown", "2026-01-01T00:00:00Z"),
        _node("node-2-0", "False", "2026-01-01T00:04:50Z"),
    ]
    lost = node_not_ready_since(nodes)
    assert set(lost) == {"node-1-0", "node-2-0"}
    desired = replace(desired_for(3), node_loss_seconds=60)
    now = lost["node-1-0"] + 300  # node-1-0 lost 300s ago, node-2-0 only 10s ago
    decision = decide(
        desired=desired,
        observed=serving(range(3), desired),
        probes=Probes(),
        memory=Memory(),
        now=NOW,
        nodes=NotReadyNodes(since=lost, now=now),
    )
    assert [p.name for p in decision.force_delete] == ["c-r1-0"]
    assert [e.reason for e in decision.events] == ["NodeLost"]
    assert decision.requeue_seconds == 50  # a look again when node-2-0 counts as lost


def _out_of_rotation() -> Observed:
    """Three replicas: 1 out of rotation as hung, 2 held after its warm-up."""
    observed = serving(range(3), healing(3))
    for index, reason in ((1, Reason.HUNG), (2, "WarmupHeld")):
        observed.replicas[index].pods[0] = replace(
            observed.replicas[index].pods[0],
            warmed=ConditionStatus.FALSE,
            warmed_reason=str(reason),
            ready=False,
        )
    return observed


def test_without_a_valid_spec_a_replica_taken_out_of_rotation_stays_out() -> None:
    # An edit the operator refuses, or a model download under way, leaves no
    # spec to judge a replica by. Before, every leader that answered /health
    # was admitted then, without warm-up: a hung engine (whose /health still
    # answers), one past its restart budget, one held after a failed warm-up.
    observed = _out_of_rotation()
    healthy = {"uid-c-r1-0": True, "uid-c-r2-0": True}
    memory = Memory(sick=frozenset({1}))
    decision = decide(
        desired=None, observed=observed, probes=Probes(healthy=healthy), memory=memory, now=NOW
    )
    assert not decision.gates and not decision.events
    assert decision.memory.sick == frozenset({1})  # still out for its health once valid again


def test_a_new_operator_process_knows_which_replicas_are_out_for_their_health() -> None:
    # From their gates' reasons: before, it forgot them, so a hung replica
    # (its /health answers) was admitted again as a new one.
    observed = _out_of_rotation()
    assert out_for_health(observed) == frozenset({1})
    targets = health_targets(observed, wanted={0, 1, 2}, nodes=1, sick=out_for_health(observed))
    assert [p.name for p in targets] == ["c-r0-0", "c-r1-0"]


def test_an_engine_kubelet_restarts_in_place_is_left_to_kubelet_and_warmed_again() -> None:
    # The engine core died: /health failed, the server exited, and kubelet
    # restarts the container in the same pod (same uid). Before, the
    # operator's checks went on counting and it deleted the pod mid-load
    # (a second model load, and kubelet's lastState gone with the pod);
    # and a reload quicker than its checks took traffic cold, its gate
    # still True from before.
    desired = healing(2)
    observed = serving(range(2), desired)
    loading = ContainerFacts(name="engine", image="i", running=True, restarts=1, started=False)
    observed.replicas[1].pods[0] = replace(
        observed.replicas[1].pods[0], ready=False, containers=(loading,)
    )
    dead = Assessment(Reason.DEAD, "/health refused", 3, 3, True)
    decision = run(desired, observed, r1=dead)
    assert not decision.delete_pods and not decision.restarts
    assert [(g.pod.name, g.status, str(g.reason)) for g in decision.gates] == [
        ("c-r1-0", False, "EngineRestarted")
    ]
    targets = health_targets(observed, wanted={0, 1}, nodes=1, sick=frozenset())
    assert [p.name for p in targets] == ["c-r0-0"]


def test_a_replica_out_for_its_health_stays_out_until_a_check_says_it_recovered() -> None:
    # A new operator process knows it from its gate (Memory.sick) before its
    # health loop has checked it: not admitted meanwhile (its /health answers).
    desired = healing(3)
    observed = _out_of_rotation()
    probes = Probes(healthy={"uid-c-r1-0": True})
    memory = Memory(sick=out_for_health(observed))
    decision = decide(desired=desired, observed=observed, probes=probes, memory=memory, now=NOW)
    assert not [g for g in decision.gates if g.status], decision.gates
    assert decision.memory.sick == frozenset({1})
    # Checked healthy: admitted again (through warm-up, none set here).
    probes = Probes(healthy={"uid-c-r1-0": True}, health={"uid-c-r1-0": OK})
    again = decide(
        desired=desired, observed=observed, probes=probes, memory=decision.memory, now=NOW
    )
    assert [(g.pod.name, g.status) for g in again.gates] == [("c-r1-0", True)]
