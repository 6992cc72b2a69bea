"""Failures in status, as `kubectl get/describe vlc` shows them: a replica
whose engine crash-loops, whose image cannot be pulled or whose Secret is
missing gets a state, its restarts and last exit, and Degraded=True with a
message that says what to do; a Warning Event when Degraded turns True."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shoal.api.status import ConditionStatus, ReplicaState, VLLMClusterStatus
from shoal.controller.decide import EventType
from shoal.controller.observe import (
    Observed,
    ReplicaFacts,
    RouterFacts,
    container_facts,
    newest_message,
    observe,
    pod_facts,
    set_facts,
)
from shoal.controller.status import build_status, degraded_event
from tests.unit.test_controller_decide import pod_for, set_for
from tests.unit.test_controller_status import conditions, inputs

KV_TOO_SMALL = (
    "INFO starting engine\n"
    "ERROR the KV cache holds 1584 tokens, fewer than max_model_len 8192: raise the KV "
    "cache size or lower --max-model-len\n"
)


def crash_looping(*, code: int = 2, reason: str = "Error", message: str = "") -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": code, "reason": reason}
    if message:
        terminated["message"] = message
    return {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.32.0",
        "restartCount": 4,
        "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {"terminated": terminated},
    }


def waiting(reason: str, message: str, image: str = "vllm/vllm-openai:v0.32.0") -> dict[str, Any]:
    return {
        "name": "engine",
        "image": image,
        "restartCount": 0,
        "ready": False,
        "state": {"waiting": {"reason": reason, "message": message}},
        "lastState": {},
    }


def fleet_with(replica0: dict[str, Any]) -> Observed:
    broken = pod_for(0, ready=False, warmed=None, containers=(container_facts(replica0),))
    return Observed(
        replicas={
            0: ReplicaFacts(index=0, leader=set_for(0, None), pods=[broken]),
            1: ReplicaFacts(index=1, leader=set_for(1, None), pods=[pod_for(1)]),
        },
        router=RouterFacts(spec_hash="h", available=1),
    )


def test_a_crash_looping_engine_is_degraded_with_its_exit_code_words_and_fix() -> None:
    status = build_status(inputs(fleet_with(crash_looping(message=KV_TOO_SMALL))))
    VLLMClusterStatus.model_validate(status)
    entry = status["replicaStatuses"][0]
    assert entry["state"] == ReplicaState.CRASH_LOOPING
    assert entry["containerRestarts"] == 4
    assert entry["lastTermination"] == "pod c-r0-0: exit code 2 (Error)"
    degraded = conditions(status)["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "EngineCrashLooping"
    message = degraded["message"]
    assert message.startswith("replica 0: the engine of pod c-r0-0 exits with code 2 (4 restarts)")
    assert "fewer than max_model_len 8192" in message
    assert "lower it" in message and "spec.engine.maxModelLen" in message
    assert message.endswith("see kubectl logs c-r0-0 --previous")
    assert entry["message"] == message.removeprefix("replica 0: ")
    assert status["replicaStatuses"][1]["state"] == ReplicaState.SERVING


def test_a_401_from_hugging_face_says_to_set_the_token_secret() -> None:
    said = (
        "huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo "
        "for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json."
    )
    status = build_status(inputs(fleet_with(crash_looping(code=1, message=said))))
    message = conditions(status)["Degraded"]["message"]
    assert "set spec.model.source.hf.tokenSecret" in message
    assert "exits with code 1" in message


def test_an_oom_killed_engine_says_to_raise_its_memory_limit() -> None:
    status = build_status(inputs(fleet_with(crash_looping(code=137, reason="OOMKilled"))))
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "EngineOOMKilled"
    assert "spec.engine.resources.limits.memory" in degraded["message"]
    assert (
        status["replicaStatuses"][0]["lastTermination"] == "pod c-r0-0: OOMKilled (exit code 137)"
    )


def test_an_image_that_cannot_be_pulled_names_the_image_and_the_fields_to_check() -> None:
    image = "vllm/vllm-openai:doesnotexist"
    status = build_status(
        inputs(fleet_with(waiting("ImagePullBackOff", f'Back-off pulling image "{image}"', image)))
    )
    assert status["replicaStatuses"][0]["state"] == ReplicaState.IMAGE_PULL_FAILING
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "ImagePullFailing"
    assert f"image {image} cannot be pulled" in degraded["message"]
    assert "check spec.image" in degraded["message"]


def test_a_missing_secret_is_misconfigured_with_kubelets_words() -> None:
    status = build_status(
        inputs(fleet_with(waiting("CreateContainerConfigError", 'Error: secret "hf" not found')))
    )
    assert status["replicaStatuses"][0]["state"] == ReplicaState.MISCONFIGURED
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "ContainerConfigError"
    assert 'secret "hf" not found' in degraded["message"]


def test_an_engine_that_restarted_once_and_serves_again_is_not_degraded() -> None:
    recovered = {
        **crash_looping(),
        "ready": True,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }
    fleet = fleet_with(recovered)
    fleet.replicas[0].pods[0] = replace(fleet.replicas[0].pods[0], ready=True, warmed=None)
    status = build_status(inputs(fleet))
    assert conditions(status)["Degraded"]["status"] == "False"
    entry = status["replicaStatuses"][0]
    assert entry["state"] != ReplicaState.CRASH_LOOPING and entry["containerRestarts"] == 4


def test_an_engine_running_again_after_a_failed_run_is_crash_looping_until_ready() -> None:
    # A real kubelet's next try runs (vLLM loads its model for minutes) before
    # it fails again: status said Starting and Degraded AsExpected meanwhile,
    # and turned Degraded again at each exit (seen on the testbed's real node).
    trying = {**crash_looping(), "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
    trying["started"] = False  # its startup probe has not passed
    status = build_status(inputs(fleet_with(trying)))
    assert conditions(status)["Degraded"]["reason"] == "EngineCrashLooping"
    assert status["replicaStatuses"][0]["state"] == ReplicaState.CRASH_LOOPING
    # Up again (its startup probe passed): a readiness probe failing later is no crash.
    flapping = build_status(inputs(fleet_with({**trying, "started": True})))
    assert conditions(flapping)["Degraded"]["status"] == "False"


def test_containers_are_read_from_the_pods_status() -> None:
    pod = {
        "metadata": {
            "name": "c-r0-0",
            "uid": "u",
            "labels": {"serving.shoal.dev/replica": "0"},
        },
        "status": {"phase": "Running", "containerStatuses": [crash_looping(message="boom")]},
    }
    facts = pod_facts(pod, gpu_resource="nvidia.com/gpu")
    assert facts is not None
    (engine,) = facts.containers
    assert (engine.exit_code, engine.exit_message, engine.restarts) == (2, "boom", 4)
    assert engine.crashed and not engine.running
    assert facts.warmed is None and facts.warmed_reason is None


def test_the_warm_up_gate_is_read_with_its_reason() -> None:
    gate = {"type": "serving.shoal.dev/warmed", "status": "False", "reason": "EngineHung"}
    pod = {
        "metadata": {"name": "c-r0-0", "uid": "u", "labels": {"serving.shoal.dev/replica": "0"}},
        "status": {"phase": "Running", "conditions": [gate]},
    }
    facts = pod_facts(pod, gpu_resource="nvidia.com/gpu")
    assert facts is not None
    assert (facts.warmed, facts.warmed_reason) == (ConditionStatus.FALSE, "EngineHung")


def _scheduling(node: str | None) -> dict[str, Any]:
    """A leader pod whose PodScheduled condition is False, bound to node or not."""
    return {
        "metadata": {"name": "c-r0-0", "uid": "u", "labels": {"serving.shoal.dev/replica": "0"}},
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": "Running" if node else "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "message": "0/6 nodes"}],
        },
    }


def test_a_pod_the_scheduler_cannot_place_is_unschedulable_with_its_message() -> None:
    facts = pod_facts(_scheduling(None), gpu_resource="nvidia.com/gpu")
    assert facts is not None and facts.unschedulable == "0/6 nodes"


def test_a_bound_pod_is_not_unschedulable_whatever_a_stale_condition_says() -> None:
    # kube-scheduler's PodScheduled=False for a deleted pod lands on its
    # same-named successor (a StatefulSet's), already bound.
    facts = pod_facts(_scheduling("gpu-h100-2"), gpu_resource="nvidia.com/gpu")
    assert facts is not None and facts.unschedulable is None and facts.node == "gpu-h100-2"


def test_a_warning_event_is_posted_when_degraded_turns_true_and_not_again() -> None:
    recovered = fleet_with({**crash_looping(), "ready": True, "state": {"running": {}}})
    pod = replace(recovered.replicas[0].pods[0], ready=True)
    recovered.replicas[0].pods[0] = pod
    healthy = build_status(inputs(recovered))
    broken = build_status(inputs(fleet_with(crash_looping()), previous=healthy))
    event = degraded_event(healthy, broken)
    assert event is not None and event.type is EventType.WARNING
    assert event.reason == "EngineCrashLooping" and "c-r0-0" in event.message
    again = build_status(inputs(fleet_with(crash_looping()), previous=broken))
    assert degraded_event(broken, again) is None


def test_a_degraded_reason_the_decision_posts_itself_is_not_posted_twice() -> None:
    recovered = fleet_with({**crash_looping(), "ready": True, "state": {"running": {}}})
    pod = replace(recovered.replicas[0].pods[0], ready=True)
    recovered.replicas[0].pods[0] = pod
    healthy = build_status(inputs(recovered))
    broken = build_status(inputs(fleet_with(crash_looping()), previous=healthy))
    assert degraded_event(healthy, broken, told="EngineCrashLooping") is None


PSA_WORDS = (
    'pods "c-r0-0" is forbidden: violates PodSecurity "restricted:latest": '
    "allowPrivilegeEscalation != false"
)


def statefulset(*, generation: int, observed: int, pods: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "c-r0",
            "uid": "u0",
            "generation": generation,
            "labels": {"serving.shoal.dev/replica": "0"},
        },
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed, "replicas": pods, "updateRevision": "r"},
    }


def failed_create(message: str, when: str) -> dict[str, Any]:
    return {"message": message, "lastTimestamp": when, "reason": "FailedCreate"}


def test_a_statefulset_lacks_pods_only_once_its_controller_has_seen_it() -> None:
    lacking = set_facts(statefulset(generation=1, observed=1, pods=0))
    assert lacking is not None and lacking.missing_pods
    just_made = set_facts(statefulset(generation=1, observed=0, pods=0))
    assert just_made is not None and not just_made.missing_pods
    whole = set_facts(statefulset(generation=2, observed=2, pods=1))
    assert whole is not None and not whole.missing_pods


def test_the_newest_refusal_counts_and_an_old_one_does_not() -> None:
    events = [
        failed_create("quota", "2026-12-06T10:00:00Z"),
        failed_create(
            f"create Pod c-r0-0 in StatefulSet c-r0 failed error: {PSA_WORDS}",
            "2026-12-06T10:05:00Z",
        ),
    ]
    assert newest_message(events, since="2026-12-06T10:01:00Z") == PSA_WORDS
    assert newest_message(events, since="2026-12-06T10:06:00Z") is None
    assert newest_message([], since="2026-12-06T10:06:00Z") is None


def test_refused_engine_pods_are_degraded_with_the_api_servers_words_and_the_fields() -> None:
    sets = [statefulset(generation=1, observed=1, pods=0)]
    seen = observe(
        statefulsets=sets, pods=[], router=None, gpu_resource="nvidia.com/gpu",
        refusals={"c-r0": PSA_WORDS},
    )  # fmt: skip
    seen = Observed(replicas=seen.replicas, router=RouterFacts(spec_hash="h", available=2))
    degraded = conditions(build_status(inputs(seen)))["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsRefused")
    assert degraded["message"].startswith(f"StatefulSet c-r0 cannot create its pods: {PSA_WORDS}; ")
    assert (
        "set spec.engine.pod.securityContext and spec.engine.pod.containerSecurityContext"
        in (degraded["message"])
    )
    # A set with its pods ignores an old refusal.
    whole = observe(
        statefulsets=[statefulset(generation=1, observed=1, pods=1)], pods=[], router=None,
        gpu_resource="nvidia.com/gpu", refusals={"c-r0": PSA_WORDS},
    )  # fmt: skip
    assert whole.replicas[0].leader is not None and whole.replicas[0].leader.refused is None


def test_refused_router_pods_are_degraded_from_the_deployments_replica_failure() -> None:
    deployment = {
        "metadata": {"name": "c-router"},
        "status": {
            "conditions": [
                {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota: q"}
            ]
        },
    }
    seen = observe(statefulsets=[], pods=[], router=deployment, gpu_resource="nvidia.com/gpu")
    assert seen.router is not None and seen.router.refused == "exceeded quota: q"
    fleet = fleet_with(crash_looping())
    fleet = Observed(replicas=fleet.replicas, router=seen.router)
    degraded = conditions(build_status(inputs(fleet)))["Degraded"]
    assert degraded["reason"] == "PodsRefused"
    assert degraded["message"] == (
        "Deployment c-router cannot create its pods: exceeded quota: q; a ResourceQuota of "
        "the namespace is used up: raise it, or lower the pods' requests"
    )
