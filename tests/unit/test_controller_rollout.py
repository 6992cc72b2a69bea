"""Rollouts that stop before they hurt, on plain facts: a replacement that
cannot run, or is not warm by rollout.progressDeadlineSeconds, gets its last
good template back and the rollout pauses (no other replica is touched)
until the spec changes; a replacement that warms up clears its marks. A new
count (an autoscaler, an HPA, `kubectl scale`) is no new spec: the pause
holds, and replicas made meanwhile get the last good template."""

from __future__ import annotations

from dataclasses import replace

from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import ConditionReason
from shoal.controller.decide import Decision, Desired, Memory, Probes, decide
from shoal.controller.desired import build_replica, manifest_hash
from shoal.controller.observe import ContainerFacts, Observed, ReplicaFacts, Waiting
from shoal.controller.rollout import (
    Marks,
    RolloutPolicy,
    digest,
    held_back,
    marks_of,
    parsed_spec,
    spec_text,
)
from tests.unit.controller_samples import REF, fleet_of, spec_of
from tests.unit.test_controller_decide import pod_for, set_for

NOW = 1000.0
WALL = 1_700_000_000.0
DEADLINE = 60.0


def spec(flag: str, replicas: int = 3) -> VLLMClusterSpec:
    return spec_of(replicas=replicas, engine={"maxModelLen": 8192, "extraArgs": [flag]})


GOOD, BAD = spec("--enforce-eager"), spec("--no-such-flag")


def desired_of(now: VLLMClusterSpec, marks: dict[int, Marks], *, wall: float = WALL) -> Desired:
    """As the reconciler builds it: stalled replicas kept at their fallback."""
    policy = RolloutPolicy(
        spec_text=spec_text(now), deadline_seconds=DEADLINE, now_wall=wall, marks=marks
    )
    fleet, fallback = held_back(REF, fleet_of(now), policy=policy)
    return Desired(
        replicas={r.index: r for r in fleet.replicas},
        nodes=1,
        max_unavailable=1,
        drain_deadline_seconds=60.0,
        warmup_enabled=False,
        rollout=policy,
        fallback=fallback,
    )


def fleet_on(built: VLLMClusterSpec, *, indices: range = range(3)) -> Observed:
    """Replicas serving the template of `built`."""
    desired = desired_of(built, {})
    return Observed(
        replicas={
            i: ReplicaFacts(index=i, leader=set_for(i, desired), pods=[pod_for(i)]) for i in indices
        },
        router=None,
    )


def crash_looping(observed: Observed, index: int, on: VLLMClusterSpec) -> None:
    """Replica index runs `on`'s template and its engine crash-loops."""
    engine = ContainerFacts(
        name="engine",
        image="vllm",
        running=False,
        restarts=3,
        waiting=Waiting.CRASH_LOOP,
        exit_code=2,
    )
    leader = set_for(index, desired_of(on, {}))
    pod = pod_for(index, ready=False, warmed=None, containers=(engine,))
    observed.replicas[index] = ReplicaFacts(index=index, leader=leader, pods=[pod])


def pending(observed: Observed, index: int, on: VLLMClusterSpec) -> None:
    leader = set_for(index, desired_of(on, {}))
    pod = pod_for(index, phase="Pending", ip=None, ready=False, warmed=None)
    observed.replicas[index] = ReplicaFacts(index=index, leader=leader, pods=[pod])


def run(desired: Desired, observed: Observed) -> Decision:
    return decide(desired=desired, observed=observed, probes=Probes(), memory=Memory(), now=NOW)


def names(decision: Decision) -> list[str]:
    return [m["metadata"]["name"] for m in decision.apply]


def test_a_replaced_replica_records_the_spec_it_served_on_and_when() -> None:
    observed = fleet_on(GOOD)
    marks = {i: Marks(built_from=spec_text(GOOD)) for i in range(3)}
    decision = run(desired_of(BAD, marks), observed)
    assert names(decision) == ["c-r0"]
    written = decision.marks["c-r0"]
    assert written.built_from == spec_text(BAD)
    assert written.last_good == spec_text(GOOD)
    assert written.replaced_at == WALL
    assert decision.stall is None


def test_a_crash_looping_replacement_gets_its_last_good_template_back_at_once() -> None:
    observed = fleet_on(GOOD)
    crash_looping(observed, 0, BAD)
    marks = {
        0: Marks(built_from=spec_text(BAD), last_good=spec_text(GOOD), replaced_at=WALL - 5),
        1: Marks(built_from=spec_text(GOOD)),
        2: Marks(built_from=spec_text(GOOD)),
    }
    decision = run(desired_of(BAD, marks), observed)
    # The old template, on replica 0 only: replicas 1 and 2 keep serving.
    assert names(decision) == ["c-r0"]
    good_hash = manifest_hash(fleet_of(GOOD).replicas[0].leader)
    assert manifest_hash(decision.apply[0]) == good_hash
    assert decision.stall is not None and decision.stall.state is ConditionReason.ROLLED_BACK
    assert "exits with code 2" in decision.stall.message
    assert "RolledBack" in [e.reason for e in decision.events]
    assert decision.marks["c-r0"].built_from == spec_text(GOOD)
    assert decision.marks["c-r0"].replaced_at is None


def test_after_a_rollback_the_pods_go_back_and_no_other_replica_is_replaced() -> None:
    observed = fleet_on(GOOD)
    # Replica 0's StatefulSet has the good template again; its pod is still the bad one.
    bad_pod = pod_for(0, ready=False, warmed=None, revision="rev-bad")
    observed.replicas[0].pods = [bad_pod]
    rolled = Marks(built_from=spec_text(GOOD), stalled=desired_of(BAD, {}).rollout.spec_digest)  # type: ignore[union-attr]
    marks = {0: rolled, 1: Marks(built_from=spec_text(GOOD)), 2: Marks(built_from=spec_text(GOOD))}
    decision = run(desired_of(BAD, marks), observed)
    assert [p.name for p in decision.delete_pods] == ["c-r0-0"]
    assert names(decision) == []
    assert decision.stall is not None and decision.stall.replica == 0

    # Serving the good template again: still paused, nothing rewritten.
    observed.replicas[0].pods = [pod_for(0)]
    settled = run(desired_of(BAD, marks), observed)
    assert names(settled) == [] and not settled.delete_pods and not settled.marks
    assert settled.stall is not None and settled.stall.state is ConditionReason.ROLLED_BACK


def test_a_pending_replacement_waits_for_its_deadline_then_goes_back() -> None:
    observed = fleet_on(GOOD)
    pending(observed, 0, BAD)
    marks = {0: Marks(built_from=spec_text(BAD), last_good=spec_text(GOOD), replaced_at=WALL)}
    within = run(desired_of(BAD, marks, wall=WALL + 10), observed)
    assert names(within) == [] and within.stall is None
    assert within.requeue_seconds is not None and within.requeue_seconds <= DEADLINE - 10

    late = run(desired_of(BAD, marks, wall=WALL + DEADLINE + 1), observed)
    assert names(late) == ["c-r0"]
    assert late.stall is not None and "progressDeadlineSeconds (60s)" in late.stall.message


def test_without_a_known_good_template_the_rollout_stalls_and_says_so() -> None:
    observed = fleet_on(GOOD)
    crash_looping(observed, 0, BAD)
    marks = {0: Marks(built_from=spec_text(BAD), replaced_at=WALL - 5)}
    decision = run(desired_of(BAD, marks), observed)
    assert names(decision) == []
    assert decision.stall is not None and decision.stall.state is ConditionReason.ROLLOUT_STALLED
    assert decision.marks["c-r0"].stalled is not None


def test_a_new_spec_resumes_a_paused_rollout() -> None:
    observed = fleet_on(GOOD)
    rolled = Marks(built_from=spec_text(GOOD), stalled=desired_of(BAD, {}).rollout.spec_digest)  # type: ignore[union-attr]
    fixed = spec("--enforce-eager=false")
    decision = run(desired_of(fixed, {0: rolled}), observed)
    assert names(decision) == ["c-r0"]
    assert decision.stall is None
    assert decision.marks["c-r0"].stalled is None
    assert decision.marks["c-r0"].last_good == spec_text(GOOD)


def test_a_replacement_that_warms_up_has_its_marks_cleared() -> None:
    observed = fleet_on(BAD)
    marks = {0: Marks(built_from=spec_text(BAD), last_good=spec_text(GOOD), replaced_at=WALL)}
    decision = run(desired_of(BAD, marks, wall=WALL + 5), observed)
    assert decision.marks["c-r0"] == Marks(built_from=spec_text(BAD))
    assert decision.stall is None


def test_a_recorded_spec_this_version_cannot_read_is_no_template_to_go_back_to() -> None:
    assert parsed_spec("{not json") is None
    assert parsed_spec('{"model": {}}') is None
    assert parsed_spec("[1]") is None
    # An annotation edited by hand may nest past Python's recursion limit.
    assert parsed_spec("[" * 100_000 + "]" * 100_000) is None
    assert parsed_spec(spec_text(GOOD)) == GOOD
    for written in ("nan", "inf", "-inf", "soon"):  # no time a replacement began
        annotated = {"metadata": {"annotations": {"serving.shoal.dev/replaced-at": written}}}
        assert marks_of(annotated).replaced_at is None
    assert replace(Marks(), built_from="x").annotations()["serving.shoal.dev/built-from"] == "x"


def test_the_old_pod_still_serving_after_the_new_template_is_applied_is_not_the_replacement() -> (
    None
):
    observed = fleet_on(BAD)
    observed.replicas[0].pods = [pod_for(0, revision="rev-0")]  # made from the old template
    marks = {0: Marks(built_from=spec_text(BAD), last_good=spec_text(GOOD), replaced_at=WALL)}
    decision = run(desired_of(BAD, marks, wall=WALL + 1), observed)
    assert "c-r0" not in decision.marks
    assert [p.name for p in decision.replace_pods] == ["c-r0-0"]  # it serves: it drains


def rolled_back_on_replica_0() -> dict[int, Marks]:
    """Replica 0 went back to GOOD after BAD could not run; the rollout is paused."""
    rolled = Marks(built_from=spec_text(GOOD), stalled=desired_of(BAD, {}).rollout.spec_digest)  # type: ignore[union-attr]
    return {0: rolled, 1: Marks(built_from=spec_text(GOOD)), 2: Marks(built_from=spec_text(GOOD))}


def test_a_scale_down_during_a_pause_does_not_apply_the_template_that_could_not_run() -> None:
    # The autoscaler, an HPA or kubectl scale set 3 -> 2: only the count changed.
    decision = run(desired_of(spec("--no-such-flag", replicas=2), rolled_back_on_replica_0()),
                   fleet_on(GOOD))  # fmt: skip
    assert "c-r0" not in names(decision)
    assert decision.stall is not None and decision.stall.state is ConditionReason.ROLLED_BACK
    assert "c-r0" not in decision.marks


def test_a_scale_up_during_a_pause_builds_the_new_replica_from_the_last_good_template() -> None:
    scaled = spec("--no-such-flag", replicas=4)
    decision = run(desired_of(scaled, rolled_back_on_replica_0()), fleet_on(GOOD))
    assert names(decision) == ["c-r3"]
    good = build_replica(REF, spec("--enforce-eager", replicas=4), index=3)
    assert manifest_hash(decision.apply[0]) == manifest_hash(good.leader)
    assert decision.stall is not None and decision.stall.state is ConditionReason.ROLLED_BACK
    # Its marks say so: the next passes keep it there while the pause holds.
    made = decision.marks["c-r3"]
    assert made.built_from == spec_text(GOOD) and made.stalled is not None

    observed = fleet_on(spec("--enforce-eager", replicas=4), indices=range(4))
    later = run(desired_of(scaled, {**rolled_back_on_replica_0(), 3: made}), observed)
    assert names(later) == [] and not later.replace_pods and not later.marks
    assert later.stall is not None

    # The spec fixed: the rollout resumes, replica 3 going back to GOOD if it must.
    fixed = spec("--enforce-eager=false", replicas=4)
    resumed = run(desired_of(fixed, {**rolled_back_on_replica_0(), 3: made}), observed)
    assert resumed.stall is None and len(names(resumed)) == 1
    assert all(m.last_good == spec_text(GOOD) for m in resumed.marks.values())


def test_a_pause_an_earlier_operator_keyed_on_the_whole_spec_holds_and_is_rekeyed() -> None:
    # Before, the pause was the digest of the whole spec text, count included.
    marks = {**rolled_back_on_replica_0(), 0: Marks(built_from=spec_text(GOOD),
                                                    stalled=digest(spec_text(BAD)))}  # fmt: skip
    decision = run(desired_of(BAD, marks), fleet_on(GOOD))
    assert names(decision) == [] and decision.stall is not None
    rekeyed = decision.marks["c-r0"]
    assert rekeyed.stalled == desired_of(BAD, {}).rollout.spec_digest  # type: ignore[union-attr]
    assert rekeyed.built_from == spec_text(GOOD)
    # Rekeyed, the pause outlasts a new count too.
    scaled = run(desired_of(spec("--no-such-flag", replicas=2), {**marks, 0: rekeyed}),
                 fleet_on(GOOD))  # fmt: skip
    assert "c-r0" not in names(scaled) and scaled.stall is not None


def test_no_replica_object_depends_on_the_fields_that_only_set_the_count() -> None:
    # Why a pause may ignore them: a replica is the same whatever the count.
    alone = spec_of(replicas=1, engine={"maxModelLen": 8192})
    scaled = spec_of(replicas=7, engine={"maxModelLen": 8192},
                     autoscaling={"minReplicas": 0, "maxReplicas": 9})  # fmt: skip
    assert build_replica(REF, alone, index=3) == build_replica(REF, scaled, index=3)
