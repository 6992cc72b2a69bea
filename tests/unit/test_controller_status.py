"""Status as users read it (kubectl get/describe): counts, conditions in the
apimachinery shape, capacity with measured KV, per-replica entries; written
only when it changes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shoal.api.status import ConditionReason, VLLMClusterStatus
from shoal.api.validation import validate_spec
from shoal.controller.decide import (
    Decision,
    Event,
    EventReason,
    EventType,
    GateReason,
    Memory,
    Probes,
)
from shoal.controller.observe import Observed, ReplicaFacts, RouterFacts
from shoal.controller.status import Refusal, StatusInputs, build_status, refusal_event, status_patch
from shoal.engine.metrics import KVPool
from tests.unit.controller_samples import spec_of
from tests.unit.test_controller_decide import pod_for, set_for


def inputs(observed: Observed, **changes: Any) -> StatusInputs:
    spec = changes.pop("spec", spec_of(replicas=2, parallelism={"tensor": 4}))
    base = StatusInputs(
        name="c",
        namespace="ns",
        generation=3,
        spec=spec,
        errors=[],
        paused=False,
        observed=observed,
        decision=Decision(),
        memory=Memory(),
        probes=Probes(),
        kv_pools={},
        previous={},
        now="2026-01-01T00:00:00Z",
    )
    return replace(base, **changes)


def two_serving() -> Observed:
    return Observed(
        replicas={
            i: ReplicaFacts(index=i, leader=set_for(i, None), pods=[pod_for(i)]) for i in (0, 1)
        },
        router=RouterFacts(spec_hash="h", available=1),
    )


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_serving_fleet_reports_ready_counts_selector_endpoint_and_capacity() -> None:
    pools = {"uid-c-r0-0": KVPool(block_size=16, gpu_blocks=1000)}
    status = build_status(inputs(two_serving(), kv_pools=pools))
    VLLMClusterStatus.model_validate(status)  # the CRD's schema comes from this model
    assert (status["replicas"], status["readyReplicas"], status["warmReplicas"]) == (2, 2, 2)
    assert status["observedGeneration"] == 3
    assert status["selector"] == "serving.shoal.dev/cluster=c,serving.shoal.dev/role=leader"
    assert status["endpoint"] == "http://c-router.ns.svc:8000"
    found = conditions(status)
    assert found["Ready"]["status"] == "True"
    assert found["Progressing"]["status"] == "False"
    assert found["SpecValid"]["status"] == "True"
    assert found["Degraded"]["status"] == "False"
    for condition in found.values():
        assert set(condition) == {
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        }
    capacity = status["capacity"]
    assert capacity["layout"] == "TP4xDP2" and capacity["kvTokensPerReplica"] > 0
    assert capacity["measured"] == [
        {"replica": 0, "kvTokens": 16000, "blockSize": 16, "gpuBlocks": 1000}
    ]
    entry = status["replicaStatuses"][1]
    assert entry["state"] == "Serving" and entry["pods"] == ["c-r1-0"] and entry["gpus"] == 4


def test_an_unchanged_fleet_produces_the_same_status_so_nothing_is_written() -> None:
    first = build_status(inputs(two_serving()))
    later = build_status(inputs(two_serving(), previous=first, now="2026-01-01T01:00:00Z"))
    assert later == first
    assert status_patch(first, later) is None


def test_transition_times_move_only_when_a_condition_changes() -> None:
    first = build_status(inputs(two_serving()))
    observed = two_serving()
    observed.replicas[1].pods = [pod_for(1, ready=False, warmed=None)]
    second = build_status(inputs(observed, previous=first, now="2026-01-01T02:00:00Z"))
    assert conditions(second)["Ready"]["lastTransitionTime"] == "2026-01-01T02:00:00Z"
    assert conditions(second)["Ready"]["message"] == "1 of 2 replicas are warm and Ready"
    assert conditions(second)["SpecValid"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert second["warmReplicas"] == 1
    assert second["replicaStatuses"][1]["state"] == "Starting"
    patch = status_patch(first, second)
    assert patch is not None and patch["warmReplicas"] == 1


def test_an_invalid_spec_reports_spec_valid_false_naming_the_field() -> None:
    spec = spec_of(
        model={
            "name": "meta-llama/Llama-3.1-70B-Instruct",
            "architecture": {"preset": "Llama-3.1-70B"},
        },
        parallelism={"tensor": 2},
        engine={"maxModelLen": 131072},
    )
    errors = validate_spec(spec)
    assert errors
    status = build_status(inputs(two_serving(), spec=spec, errors=errors))
    found = conditions(status)
    assert found["SpecValid"]["status"] == "False"
    assert found["SpecValid"]["reason"] == "InvalidSpec"
    assert "spec.engine.maxModelLen" in found["SpecValid"]["message"]
    assert found["Progressing"]["reason"] == "InvalidSpec"


def test_draining_replicas_and_unschedulable_pods_show_in_status() -> None:
    observed = two_serving()
    observed.replicas[2] = ReplicaFacts(index=2, leader=set_for(2, None), pods=[pod_for(2)])
    observed.replicas[1].pods = [pod_for(1, node=None, phase="Pending", unschedulable="0/6 nodes")]
    status = build_status(inputs(observed))
    states = {r["index"]: r["state"] for r in status["replicaStatuses"]}
    assert states == {0: "Serving", 1: "Unhealthy", 2: "Draining"}
    assert conditions(status)["Degraded"]["reason"] == "Unschedulable"
    assert conditions(status)["Progressing"]["reason"] == "ScalingDown"


def test_group_restarts_are_counted_with_their_reason() -> None:
    decision = Decision(restarts={0: "pod c-r0-w-1 replaced a member"})
    status = build_status(inputs(two_serving(), decision=decision))
    entry = status["replicaStatuses"][0]
    assert entry["restarts"] == 1
    assert entry["lastRestartReason"] == "pod c-r0-w-1 replaced a member"
    again = build_status(inputs(two_serving(), decision=decision, previous=status))
    assert again["replicaStatuses"][0]["restarts"] == 2


def test_operator_metrics_count_events_by_reason_and_still_post_them() -> None:
    from prometheus_client import generate_latest

    from shoal.controller.metrics import OperatorMetrics

    posted: list[Event] = []
    metrics = OperatorMetrics()
    post = metrics.counting(lambda _body, event: posted.append(event))
    body = {"metadata": {"namespace": "team", "name": "c"}}
    post(body, Event(EventType.NORMAL, EventReason.REPLICA_RESTARTED, "hung"))
    post(body, Event(EventType.NORMAL, EventReason.REPLICA_RESTARTED, "hung again"))
    post(body, Event(EventType.WARNING, GateReason.WARMUP_TIMED_OUT, "admitted"))
    text = generate_latest(metrics.registry).decode()
    cluster = 'namespace="team",reason="{}",type="{}",vllmcluster="c"'
    assert (
        f"shoal_operator_events_total{{{cluster.format('ReplicaRestarted', 'Normal')}}} 2.0" in text
    )
    assert (
        f"shoal_operator_events_total{{{cluster.format('WarmupTimedOut', 'Warning')}}} 1.0" in text
    )
    assert [e.reason for e in posted] == ["ReplicaRestarted", "ReplicaRestarted", "WarmupTimedOut"]


def test_a_refused_child_write_is_spec_valid_false_with_the_api_servers_words() -> None:
    refused = Refusal(
        "StatefulSet c-r0",
        422,
        'StatefulSet.apps "c-r0" is invalid: spec.template.spec.containers[0].env[1].name: '
        "Required value",
    )
    status = build_status(inputs(two_serving(), refused=(refused,)))
    found = conditions(status)
    assert found["SpecValid"]["status"] == "False"
    assert found["SpecValid"]["reason"] == "ChildRefused"
    assert "StatefulSet c-r0: " in found["SpecValid"]["message"]
    assert "env[1].name: Required value" in found["SpecValid"]["message"]
    assert (found["Progressing"]["status"], found["Progressing"]["reason"]) == (
        "False",
        "ChildRefused",
    )
    # What runs is still described, for the generation the operator saw.
    assert status["observedGeneration"] == 3
    assert status["readyReplicas"] == 2 and found["Ready"]["status"] == "True"


def test_a_child_write_refused_for_another_reason_is_degraded_reconcile_failed() -> None:
    refused = Refusal("Service c-router", 403, "forbidden")
    found = conditions(build_status(inputs(two_serving(), refused=(refused,))))
    assert (found["Degraded"]["status"], found["Degraded"]["reason"]) == ("True", "ReconcileFailed")
    assert found["SpecValid"]["status"] == "True"
    assert refusal_event((refused,)) == Event(
        EventType.WARNING, ConditionReason.RECONCILE_FAILED, "Service c-router: forbidden"
    )


def test_a_name_held_by_another_object_is_name_taken_before_other_refusals() -> None:
    taken = Refusal("ConfigMap c-router", 409, "exists and is not this VLLMCluster's", taken=True)
    invalid = Refusal("StatefulSet c-r0", 422, "env[1].name: Required value")
    both = (invalid, taken)
    found = conditions(build_status(inputs(two_serving(), refused=both)))
    assert (found["SpecValid"]["status"], found["SpecValid"]["reason"]) == ("False", "NameTaken")
    assert (
        found["SpecValid"]["message"] == "ConfigMap c-router: exists and is not this VLLMCluster's"
    )
    progressing = found["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "NameTaken")
    assert progressing["message"].startswith(
        "names held by other objects: ConfigMap c-router; "
        "the API server refused StatefulSet c-r0 (see SpecValid)"
    )
    assert found["Degraded"]["status"] == "False"  # the spec's to fix, not a failure
    event = refusal_event(both)
    assert event is not None and event.reason == "NameTaken"


def test_an_invalid_spec_with_nothing_running_says_so_in_ready_not_that_replicas_are_0() -> None:
    # A cluster refused by the operator from the start (the API server admitted
    # it under an older CRD): nothing runs, and spec.replicas is 2, not 0.
    spec = spec_of(replicas=2, parallelism={"tensor": 4})
    errors = validate_spec(spec_of(replicas=2, parallelism={"tensor": 3}))
    assert errors
    for parsed in (spec, None):  # checked, or not even parsed
        nothing = Observed(replicas={}, router=None)
        found = conditions(build_status(inputs(nothing, spec=parsed, errors=errors)))
        for kind in ("Ready", "Available"):
            assert found[kind]["status"] == "False"
            assert found[kind]["reason"] == "InvalidSpec", found[kind]
            assert "see SpecValid" in found[kind]["message"]
            assert "spec.replicas is 0" not in found[kind]["message"]
