"""Why a replica's pods do not run, as `kubectl describe vlc` says it, read
from the pods as the API server lists them:

- an init container (a webhook's: Vault agent, istio-init) that crash-loops,
  cannot be pulled or lacks a Secret fails its replica like an engine would,
  named as the init container of its pod; one that completed is no failure;
- a pod scheduled long ago whose containers still wait to be created (a
  volume it cannot mount, a runtime class without a handler) is PodStuck;
- a pod the scheduler cannot place, or that failed (evicted, refused by
  kubelet), names its replica, kubelet's or the scheduler's words and the
  spec fields to change, in Degraded and in the replica's entry, within the
  status fields' limits;
- an engine that exits 0 (vLLM's clean shutdown on a probe's SIGTERM) is
  restarted all the same, so it crash-loops: Degraded does not flap."""

from __future__ import annotations

from typing import Any

from shoal.api.status import REPLICA_MESSAGE_CHARS, VLLMClusterStatus
from shoal.controller.observe import (
    Observed,
    ReplicaFacts,
    RouterFacts,
    container_facts,
    pod_facts,
)
from shoal.controller.status import POD_STUCK_SECONDS, build_status, degraded_event
from tests.unit.test_controller_decide import pod_for, set_for
from tests.unit.test_controller_status import conditions, inputs

SCHEDULED = "2026-01-01T00:00:00Z"
IMAGE = "vllm/vllm-openai:v0.32.0"


def engine_pod(status: dict[str, Any], *, node: str | None = "gpu-1") -> dict[str, Any]:
    """Replica 0's leader pod, asking for 4 GPUs, with this status."""
    spec: dict[str, Any] = {
        "containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    labels = {"serving.shoal.dev/replica": "0", "serving.shoal.dev/role": "leader"}
    return {
        "metadata": {"name": "c-r0-0", "uid": "u0", "labels": labels},
        "spec": spec,
        "status": status,
    }


def status_of(pod: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The cluster's status with replica 0 made of this pod, replica 1 serving."""
    facts = pod_facts(pod, gpu_resource="nvidia.com/gpu")
    assert facts is not None
    observed = Observed(
        replicas={
            0: ReplicaFacts(index=0, leader=set_for(0, None), pods=[facts]),
            1: ReplicaFacts(index=1, leader=set_for(1, None), pods=[pod_for(1)]),
        },
        router=RouterFacts(spec_hash="h", available=1),
    )
    status = build_status(inputs(observed, **changes))
    VLLMClusterStatus.model_validate(status)  # within the CRD's limits
    return status


def scheduled(*, at: str = SCHEDULED) -> dict[str, Any]:
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": at}


def engine_waiting(reason: str) -> dict[str, Any]:
    return {
        "name": "engine",
        "image": IMAGE,
        "restartCount": 0,
        "ready": False,
        "started": False,
        "state": {"waiting": {"reason": reason}},
    }


def initializing(init: dict[str, Any]) -> dict[str, Any]:
    """A pod held back by this init container, its engine waiting for it."""
    return {
        "phase": "Pending",
        "podIP": "10.0.0.5",
        "conditions": [scheduled()],
        "initContainerStatuses": [init],
        "containerStatuses": [engine_waiting("PodInitializing")],
    }


VAULT_CRASH = {
    "name": "vault-agent-init",
    "image": "hashicorp/vault:1.15",
    "restartCount": 6,
    "ready": False,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
    "lastState": {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "message": 'permission denied: role "vllm" not found',
        }
    },
}


def degraded(status: dict[str, Any]) -> dict[str, Any]:
    return conditions(status)["Degraded"]


def replica0(status: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = status["replicaStatuses"][0]
    return entry


# Init containers


def test_a_crash_looping_init_container_is_named_with_its_pod_exit_and_logs() -> None:
    status = status_of(engine_pod(initializing(VAULT_CRASH)))
    found = degraded(status)
    assert (found["status"], found["reason"]) == ("True", "EngineCrashLooping")
    message = found["message"]
    assert message.startswith("replica 0: init container vault-agent-init of pod c-r0-0 ")
    assert "exits with code 1" in message and 'role "vllm" not found' in message
    assert "kubectl logs c-r0-0 -c vault-agent-init --previous" in message
    assert "the engine" not in message
    entry = replica0(status)
    assert entry["state"] == "CrashLooping"
    assert entry["message"] == message.removeprefix("replica 0: ")


def test_an_init_container_image_that_cannot_be_pulled_names_it_and_not_spec_image() -> None:
    istio = {
        "name": "istio-init",
        "image": "docker.io/istio/proxyv2:bad",
        "restartCount": 0,
        "ready": False,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}},
    }
    status = status_of(engine_pod(initializing(istio)))
    found = degraded(status)
    assert found["reason"] == "ImagePullFailing"
    assert "init container istio-init of pod c-r0-0" in found["message"]
    assert "docker.io/istio/proxyv2:bad" in found["message"]
    assert "spec.image" not in found["message"]
    assert replica0(status)["state"] == "ImagePullFailing"


def test_an_init_container_missing_a_secret_is_misconfigured_with_kubelets_words() -> None:
    gcsfuse = {
        "name": "gcsfuse-init",
        "image": "gcr.io/gcsfuse:1",
        "restartCount": 0,
        "ready": False,
        "state": {
            "waiting": {
                "reason": "CreateContainerConfigError",
                "message": 'secret "bucket-key" not found',
            }
        },
    }
    status = status_of(engine_pod(initializing(gcsfuse)))
    found = degraded(status)
    assert found["reason"] == "ContainerConfigError"
    assert "init container gcsfuse-init of pod c-r0-0" in found["message"]
    assert 'secret "bucket-key" not found' in found["message"]
    assert replica0(status)["state"] == "Misconfigured"


def test_a_completed_init_container_is_no_failure() -> None:
    done = {
        "name": "vault-agent-init",
        "image": "hashicorp/vault:1.15",
        "restartCount": 0,
        "ready": True,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }
    loading = {**engine_waiting("PodInitializing"), "state": {"running": {}}}
    pod = engine_pod(
        {
            "phase": "Running",
            "podIP": "10.0.0.5",
            "conditions": [scheduled()],
            "initContainerStatuses": [done],
            "containerStatuses": [loading],
        }
    )
    facts = pod_facts(pod, gpu_resource="nvidia.com/gpu")
    assert facts is not None and [c.name for c in facts.init_containers] == ["vault-agent-init"]
    assert facts.init_containers[0].init and not facts.init_containers[0].crashed
    late = status_of(pod, now="2026-01-01T02:00:00Z")  # long after, still loading: no PodStuck
    assert degraded(late)["status"] == "False"
    assert replica0(late)["state"] == "Starting" and replica0(late).get("message") is None


# Pods stuck in creation


def stuck_pod(*engines: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending", "conditions": [scheduled()]}
    if engines:
        status["containerStatuses"] = list(engines)
    if init:
        status["initContainerStatuses"] = list(init)
    return engine_pod(status)


def after(seconds: int) -> str:
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"2026-01-01T{hours:02d}:{minutes:02d}:{rest:02d}Z"


def test_a_pod_creating_its_containers_for_too_long_is_pod_stuck_naming_what_to_read() -> None:
    pod = stuck_pod(engine_waiting("ContainerCreating"))
    early = status_of(pod, now=after(POD_STUCK_SECONDS - 60))
    assert degraded(early)["status"] == "False"
    assert replica0(early)["state"] == "Starting"
    late = status_of(pod, now=after(POD_STUCK_SECONDS + 60))
    found = degraded(late)
    assert (found["status"], found["reason"]) == ("True", "PodStuck")
    assert found["message"].startswith("replica 0: pod c-r0-0 ")
    assert (
        "see kubectl describe pod c-r0-0 (its Events: a volume it cannot mount, or "
        "spec.engine.pod.runtimeClassName without a handler on the node)" in found["message"]
    )
    entry = replica0(late)
    assert entry["state"] == "Unhealthy" and entry["message"].startswith("pod c-r0-0 ")
    # The message does not move with the clock: an idle stuck pod writes no status.
    later = status_of(pod, now=after(POD_STUCK_SECONDS + 3600), previous=late)
    assert later == late


def test_a_pod_stuck_initializing_or_without_container_statuses_is_pod_stuck() -> None:
    vault = {**engine_waiting("PodInitializing"), "name": "vault-agent-init"}
    for pod in (stuck_pod(engine_waiting("PodInitializing"), init=(vault,)), stuck_pod()):
        found = degraded(status_of(pod, now=after(POD_STUCK_SECONDS + 60)))
        assert found["reason"] == "PodStuck", pod


def test_a_pod_whose_container_ran_is_not_stuck_whatever_its_age() -> None:
    ran = {
        **engine_waiting("ContainerCreating"),
        "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }
    found = degraded(status_of(stuck_pod(ran), now=after(POD_STUCK_SECONDS + 60)))
    assert found["reason"] != "PodStuck"


# Unschedulable and failed pods

INSUFFICIENT = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
    "available: 3 No preemption victims found for incoming pod."
)


def unschedulable(message: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    return engine_pod(
        {"phase": "Pending", "conditions": [{**condition, "message": message}]}, node=None
    )


def test_too_few_gpus_names_the_replica_the_gpus_one_node_needs_and_the_fields() -> None:
    status = status_of(unschedulable(INSUFFICIENT))
    found = degraded(status)
    assert found["reason"] == "Unschedulable"
    message = found["message"]
    assert message.startswith("replica 0: pod c-r0-0 cannot be scheduled: 0/3 nodes")
    assert "needs 4 nvidia.com/gpu on one node" in message
    assert "spec.parallelism.tensor" in message
    entry = replica0(status)
    assert entry["state"] == "Unhealthy"
    assert entry["message"] == message.removeprefix("replica 0: ")


def test_a_selector_or_a_taint_no_node_matches_names_the_placement_fields() -> None:
    selector = "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
    message = degraded(status_of(unschedulable(selector)))["message"]
    assert "spec.gpu.product" in message and "spec.placement.nodeSelector" in message
    assert "spec.placement.tolerations" not in message
    taint = "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: llm}."
    message = degraded(status_of(unschedulable(taint)))["message"]
    assert "spec.placement.tolerations" in message and "spec.gpu.product" not in message


def test_the_schedulers_words_are_bounded_to_the_status_fields() -> None:
    status = status_of(unschedulable(INSUFFICIENT + " x" * 20000))
    assert len(replica0(status)["message"]) <= REPLICA_MESSAGE_CHARS
    assert "needs 4 nvidia.com/gpu on one node" in replica0(status)["message"]


def failed(reason: str, message: str) -> dict[str, Any]:
    return engine_pod({"phase": "Failed", "reason": reason, "message": message})


def test_an_evicted_pod_says_why_and_to_set_the_engines_requests() -> None:
    words = (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, "
        "available: 2Gi. Container engine was using 80Gi, request is 0"
    )
    status = status_of(failed("Evicted", words))
    found = degraded(status)
    assert found["reason"] == "PodFailed"
    assert found["message"].startswith("replica 0: pod c-r0-0 failed (Evicted): The node was")
    assert "spec.engine.resources.requests" in found["message"]
    assert replica0(status)["message"] == found["message"].removeprefix("replica 0: ")


def test_a_pod_kubelet_refused_keeps_kubelets_words() -> None:
    words = (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable "
        "for nvidia.com/gpu. Requested: 4, Available: 0, which is unexpected"
    )
    found = degraded(status_of(failed("UnexpectedAdmissionError", words)))
    assert "UnexpectedAdmissionError" in found["message"]
    assert "Allocate failed" in found["message"] and "gpu-1" in found["message"]


# An engine that exits 0


def engine_exited_0(*, waiting: bool) -> dict[str, Any]:
    state: dict[str, Any] = (
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
        if waiting
        else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    )
    return {
        "name": "engine",
        "image": IMAGE,
        "restartCount": 4,
        "ready": False,
        "started": False,
        "state": state,
        "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }


def test_an_engine_that_exits_0_and_is_restarted_has_crashed() -> None:
    assert container_facts(engine_exited_0(waiting=False)).crashed
    up = {**engine_exited_0(waiting=False), "started": True, "ready": True}
    assert not container_facts(up).crashed


def test_an_engine_exiting_0_over_and_over_turns_degraded_once() -> None:
    running = engine_pod({"phase": "Running", "podIP": "10.0.0.5", "conditions": [scheduled()]})
    previous: dict[str, Any] = {}
    reasons = []
    for _ in range(3):
        for waiting in (True, False):
            pod = {
                **running,
                "status": {
                    **running["status"],
                    "containerStatuses": [engine_exited_0(waiting=waiting)],
                },
            }
            status = status_of(pod, previous=previous)
            assert degraded(status)["status"] == "True"
            if (event := degraded_event(previous, status)) is not None:
                reasons.append(event.reason)
            previous = status
    assert reasons == ["EngineCrashLooping"]
