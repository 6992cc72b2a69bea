"""The operator's decisions on plain facts: create, roll out at most
maxUnavailable replicas at a time, drain before removing, restart broken
multi-node groups whole, admit healthy leaders, and change nothing on an
invalid spec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shoal.api.status import ConditionReason, ConditionStatus
from shoal.controller.decide import (
    DRAIN_GRACE_SECONDS,
    Desired,
    HealPolicy,
    Memory,
    Probes,
    decide,
    group_token,
    probe_targets,
)
from shoal.controller.desired import manifest_hash
from shoal.controller.observe import Observed, PodFacts, ReplicaFacts, SetFacts
from shoal.engine.metrics import MetricsSnapshot
from tests.unit.controller_samples import fleet_of, spec_of

NOW = 1000.0


def desired_for(
    replicas: int, *, tensor: int = 4, max_unavailable: int = 1, **spec: object
) -> Desired:
    built = spec_of(
        replicas=replicas,
        parallelism={"tensor": tensor},
        rollout={"maxUnavailable": max_unavailable},
        **spec,
    )
    fleet = fleet_of(built)
    return Desired(
        replicas={r.index: r for r in fleet.replicas},
        nodes=max(1, tensor // 8) if tensor > 8 else 1,
        max_unavailable=max_unavailable,
        drain_deadline_seconds=60.0,
        warmup_enabled=False,
    )


def set_for(
    index: int, desired: Desired | None, *, role: str = "leader", current: bool = True
) -> SetFacts:
    objects = desired.replicas.get(index) if desired is not None else None
    manifest = None
    if objects is not None:
        manifest = objects.leader if role == "leader" else objects.worker
    return SetFacts(
        name=f"c-r{index}" + ("-w" if role == "worker" else ""),
        uid=f"set-{index}-{role}",
        replica=index,
        role=role,
        spec_hash=manifest_hash(manifest) if current and manifest is not None else "old",
        generation=1,
        observed_generation=1,
        update_revision="rev-1",
        held=False,
    )


def pod_for(index: int, *, role: str = "leader", rank: int = 0, **changes: object) -> PodFacts:
    name = f"c-r{index}-0" if role == "leader" else f"c-r{index}-w-{rank}"
    pod = PodFacts(
        name=name,
        uid=f"uid-{name}",
        replica=index,
        role=role,
        phase="Running",
        ip=f"127.0.{index}.{rank + 1}",
        node=f"node-{index}-{rank}",
        terminating=False,
        ready=role == "leader",
        containers_ready=True,
        warmed=ConditionStatus.TRUE if role == "leader" else None,
        restarts=0,
        revision="rev-1",
        group=None,
        unschedulable=None,
        gpus=4,
    )
    return replace(pod, **changes)  # type: ignore[arg-type]


def serving(indices: range, desired: Desired | None, *, current: bool = True) -> Observed:
    return Observed(
        replicas={
            i: ReplicaFacts(index=i, leader=set_for(i, desired, current=current), pods=[pod_for(i)])
            for i in indices
        },
        router=None,
    )


def applied_names(decision: object) -> list[str]:
    return [m["metadata"]["name"] for m in decision.apply]  # type: ignore[attr-defined]


def test_missing_replicas_are_created_and_existing_ones_left_alone() -> None:
    desired = desired_for(3)
    decision = decide(
        desired=desired,
        observed=serving(range(1), desired),
        probes=Probes(),
        memory=Memory(),
        now=NOW,
    )
    assert applied_names(decision) == ["c-r1", "c-r2"]
    assert [e.reason for e in decision.events] == ["ReplicaCreated", "ReplicaCreated"]
    assert not decision.delete_pods and not decision.delete_sets


def test_an_idle_fleet_that_matches_the_spec_needs_nothing_and_no_probes() -> None:
    desired = desired_for(2)
    observed = serving(range(2), desired)
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert not (decision.apply or decision.delete_pods or decision.gates or decision.events)
    assert decision.requeue_seconds is None
    leaders = {"uid-c-r0-0", "uid-c-r1-0"}
    assert probe_targets(observed, wanted={0, 1}, nodes=1, kv_known=leaders) == ([], [])


def test_a_spec_change_replaces_one_replica_at_a_time_lowest_index_first() -> None:
    desired = desired_for(3)
    observed = serving(range(3), desired, current=False)
    first = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert applied_names(first) == ["c-r0"]
    assert first.memory.in_flight == {0}

    # r0's new template is applied and its old pod is about to go: r1 waits.
    observed.replicas[0].leader = set_for(0, desired)
    observed.replicas[0].pods = [pod_for(0, revision="rev-0")]
    second = decide(
        desired=desired, observed=observed, probes=Probes(), memory=first.memory, now=NOW
    )
    # It serves: deleted with its own grace, so its requests drain (before:
    # with a restart's 5 s, which cut them).
    assert [p.name for p in second.replace_pods] == ["c-r0-0"]
    assert not second.delete_pods
    assert applied_names(second) == []

    # The new r0 pod exists but is not Ready yet: still nothing else.
    observed.replicas[0].pods = [pod_for(0, ready=False, warmed=None)]
    third = decide(
        desired=desired, observed=observed, probes=Probes(), memory=second.memory, now=NOW
    )
    assert applied_names(third) == [] and not third.delete_pods

    # r0 Ready on the new template: r1 is next.
    observed.replicas[0].pods = [pod_for(0)]
    fourth = decide(
        desired=desired, observed=observed, probes=Probes(), memory=third.memory, now=NOW
    )
    assert applied_names(fourth) == ["c-r1"]
    assert fourth.memory.in_flight == {1}


def test_max_unavailable_counts_replicas_that_are_already_down() -> None:
    desired = desired_for(3, max_unavailable=2)
    observed = serving(range(3), desired, current=False)
    observed.replicas[2].pods = [pod_for(2, ready=False)]
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    # r2 is down anyway (replaced for free); one more may go: r0.
    assert applied_names(decision) == ["c-r0", "c-r2"]


def test_outdated_pods_of_a_multi_node_group_are_replaced_together() -> None:
    desired = desired_for(1, tensor=16)
    replica = ReplicaFacts(
        index=0,
        leader=set_for(0, desired),
        worker=set_for(0, desired, role="worker"),
        pods=[pod_for(0), pod_for(0, role="worker", rank=1, revision="rev-0")],
    )
    observed = Observed(replicas={0: replica}, router=None)
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert sorted(p.name for p in decision.replace_pods) == ["c-r0-0", "c-r0-w-1"]


def test_scale_down_drains_before_removing_the_highest_replicas() -> None:
    desired = desired_for(1)
    observed = serving(range(3), desired)
    busy = MetricsSnapshot(running=2, waiting=0)
    idle = MetricsSnapshot(running=0, waiting=0)

    first = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert sorted((g.pod.name, g.status) for g in first.gates) == [
        ("c-r1-0", False),
        ("c-r2-0", False),
    ]
    assert not first.delete_sets
    assert first.requeue_seconds is not None

    later = NOW + DRAIN_GRACE_SECONDS + 1
    probes = Probes(metrics={"uid-c-r1-0": busy, "uid-c-r2-0": idle})
    for index in (1, 2):
        observed.replicas[index].pods = [pod_for(index, ready=False, warmed=ConditionStatus.FALSE)]
    second = decide(
        desired=desired, observed=observed, probes=probes, memory=first.memory, now=later
    )
    assert [s.name for s in second.delete_sets] == ["c-r2"]  # r1 still has requests in flight
    assert "ReplicaRemoved" in [e.reason for e in second.events]

    deadline = NOW + desired.drain_deadline_seconds + 1
    third = decide(
        desired=desired, observed=observed, probes=probes, memory=second.memory, now=deadline
    )
    assert [s.name for s in third.delete_sets] == ["c-r1"]
    assert "deadline" in next(e.message for e in third.events if e.reason == "ReplicaRemoved")


def test_pods_left_of_a_removed_replica_are_not_drained_again() -> None:
    desired = desired_for(1)
    observed = serving(range(2), desired)
    observed.replicas[1] = ReplicaFacts(index=1, pods=[pod_for(1, terminating=True)])
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert not (decision.events or decision.gates or decision.delete_sets)


def test_a_replica_scaled_back_up_while_draining_is_admitted_again() -> None:
    desired = desired_for(2)
    observed = serving(range(2), desired)
    observed.replicas[1].pods = [pod_for(1, ready=False, warmed=ConditionStatus.FALSE)]
    probes = Probes(healthy={"uid-c-r1-0": True})
    decision = decide(
        desired=desired,
        observed=observed,
        probes=probes,
        memory=Memory(drain_started={1: NOW}),
        now=NOW,
    )
    assert [(g.pod.name, g.status) for g in decision.gates] == [("c-r1-0", True)]
    assert not decision.delete_sets and decision.memory.drain_started == {}


def test_a_replaced_worker_restarts_its_whole_group() -> None:
    desired = desired_for(1, tensor=16)
    leader, worker = pod_for(0), pod_for(0, role="worker", rank=1)
    token = group_token([leader, worker])
    replacement = replace(worker, uid="uid-new-worker")
    replica = ReplicaFacts(
        index=0,
        leader=set_for(0, desired),
        worker=set_for(0, desired, role="worker"),
        pods=[replace(leader, group=token), replacement],
    )
    observed = Observed(replicas={0: replica}, router=None)
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert sorted(p.uid for p in decision.delete_pods) == ["uid-c-r0-0", "uid-new-worker"]
    assert decision.restarts == {0: "pod c-r0-w-1 replaced a member"}
    assert [e.reason for e in decision.events] == ["GroupRestarted"]


def _formed_group(desired: Desired, **worker: object) -> Observed:
    """A formed group of two (stamped with its token), its worker as `worker` says."""
    leader, member = pod_for(0), pod_for(0, role="worker", rank=1)
    token = group_token([leader, member])
    replica = ReplicaFacts(
        index=0,
        leader=set_for(0, desired),
        worker=set_for(0, desired, role="worker"),
        pods=[replace(leader, group=token), replace(member, group=token, **worker)],  # type: ignore[arg-type]
    )
    return Observed(replicas={0: replica}, router=None)


def test_a_worker_gone_before_its_replacement_restarts_its_group_and_is_named() -> None:
    # Seen in CI: the pass came while the deleted worker was terminating, so
    # only the leader was left, and the reason said no more than "a member".
    desired = desired_for(1, tensor=16)
    observed = _formed_group(desired, terminating=True)
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert [p.uid for p in decision.delete_pods] == ["uid-c-r0-0"]
    assert decision.restarts == {0: "pod c-r0-w-1 is gone"}


def test_a_restarted_member_restarts_its_group_and_a_fresh_group_is_stamped() -> None:
    desired = desired_for(1, tensor=16)
    members = [pod_for(0, warmed=None, ready=False), pod_for(0, role="worker", rank=1)]
    replica = ReplicaFacts(
        index=0, leader=set_for(0, desired), worker=set_for(0, desired, role="worker"), pods=members
    )
    observed = Observed(replicas={0: replica}, router=None)
    fresh = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert not fresh.delete_pods
    assert {(p.name, t) for p, t in fresh.stamps} == {
        ("c-r0-0", group_token(members)),
        ("c-r0-w-1", group_token(members)),
    }
    replica.pods = [members[0], replace(members[1], restarts=1)]
    restarted = decide(
        desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW
    )
    assert len(restarted.delete_pods) == 2
    assert "restarted" in restarted.restarts[0]


def test_a_member_that_keeps_crashing_restarts_its_group_with_backoff_within_the_budget() -> None:
    """Each restart makes new pods, so kubelet's own back-off never starts:
    without the heal policy's, a worker that crashes at start-up had its
    group deleted and made again as fast as it crashed, and the crash's exit
    code went with each deleted pod."""
    policy = HealPolicy(
        backoff_initial_seconds=10, backoff_max_seconds=300, max_restarts=3, window_seconds=600
    )
    desired = replace(desired_for(1, tensor=16), heal=policy)
    observed = _formed_group(desired, restarts=1)  # its engine exited; kubelet restarted it

    first = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert len(first.delete_pods) == 2
    assert first.memory.restart_times == {0: (NOW,)}

    # Crashed again 4 s after that restart: out of rotation until 10 s have passed.
    soon = decide(
        desired=desired, observed=observed, probes=Probes(), memory=first.memory, now=NOW + 4
    )
    assert not soon.delete_pods and not soon.restarts
    assert [(g.pod.name, g.status) for g in soon.gates] == [("c-r0-0", False)]
    assert soon.unhealthy == {0}
    assert soon.requeue_seconds == pytest.approx(6)
    assert soon.memory.restart_times == {0: (NOW,)}

    later = decide(
        desired=desired, observed=observed, probes=Probes(), memory=first.memory, now=NOW + 10
    )
    assert len(later.delete_pods) == 2
    assert later.memory.restart_times == {0: (NOW, NOW + 10)}

    spent = Memory(restart_times={0: (NOW, NOW + 10, NOW + 30)})
    done = decide(desired=desired, observed=observed, probes=Probes(), memory=spent, now=NOW + 400)
    assert not done.delete_pods
    assert done.unhealthy == {0}
    assert done.degraded is not None
    assert done.degraded[0] is ConditionReason.RESTART_BUDGET_EXHAUSTED
    assert "c-r0-w-1" in done.degraded[1], done.degraded[1]


def test_a_leader_is_admitted_once_its_engine_answers_health_and_its_group_is_complete() -> None:
    desired = desired_for(1, tensor=16)
    leader = pod_for(0, ready=False, warmed=None)
    replica = ReplicaFacts(
        index=0, leader=set_for(0, desired), worker=set_for(0, desired, role="worker")
    )
    replica.pods = [leader]
    observed = Observed(replicas={0: replica}, router=None)
    probes = Probes(healthy={leader.uid: True})
    alone = decide(desired=desired, observed=observed, probes=probes, memory=Memory(), now=NOW)
    assert not alone.gates  # the worker rank is missing
    replica.pods = [leader, pod_for(0, role="worker", rank=1)]
    assert probe_targets(observed, wanted={0}, nodes=2, kv_known=set())[0] == [leader]
    unhealthy = decide(
        desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW
    )
    assert not unhealthy.gates and unhealthy.requeue_seconds is not None
    admitted = decide(desired=desired, observed=observed, probes=probes, memory=Memory(), now=NOW)
    assert [(g.pod.name, g.status) for g in admitted.gates] == [("c-r0-0", True)]


def test_an_invalid_spec_creates_replaces_and_removes_nothing() -> None:
    old = desired_for(3)
    observed = serving(range(3), old, current=False)
    observed.replicas[1].pods = [pod_for(1, ready=False, warmed=None)]
    probes = Probes(healthy={"uid-c-r1-0": True})
    decision = decide(desired=None, observed=observed, probes=probes, memory=Memory(), now=NOW)
    assert not (decision.apply or decision.delete_sets or decision.delete_pods)
    # Running replicas are still kept admitted.
    assert [(g.pod.name, g.status) for g in decision.gates] == [("c-r1-0", True)]


def test_a_held_replica_is_taken_out_of_rotation_and_not_replaced() -> None:
    desired = desired_for(2)
    observed = serving(range(2), desired, current=False)
    observed.replicas[0].leader = replace(set_for(0, desired, current=False), held=True)
    decision = decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)
    assert [(g.pod.name, g.status, g.reason) for g in decision.gates] == [("c-r0-0", False, "Held")]
    assert applied_names(decision) == ["c-r1"]
