"""Failures in status, on the testbed's kwok nodes (the pod runner reports
containers as kubelet does): an engine that exits at start and an image that
cannot be pulled show up in `kubectl get vlc` and `kubectl describe vlc`
within a minute, with the reason, what to do, and a Warning Event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    cluster,
    cluster_manifest,
    condition_of,
    events,
    printed_columns,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-fail"


def _degraded(bed: Testbed, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    for found in cluster(bed, ns, name).get("status", {}).get("conditions", []):
        if found["type"] == "Degraded" and found["status"] == "True" and found["reason"] == reason:
            return dict(found)
    return None


def _says_why(bed: Testbed, ns: str, name: str, reason: str, words: str) -> str:
    """Degraded turns True with reason within a minute, and `kubectl get`,
    `kubectl describe` and a Warning Event say so; Degraded's message."""
    degraded = wait_for(
        lambda: _degraded(bed, ns, name, reason),
        what=f"{name} Degraded with {reason}",
        timeout=60,
    )
    assert printed_columns(bed, ns, name)["STATUS"] == reason
    described = bed.kubectl("describe", "vlc", name, "-n", ns)
    assert reason in described and words in described, described
    warnings = [e for e in events(bed, ns, name) if e["type"] == "Warning"]
    assert reason in [e["reason"] for e in warnings]
    return str(degraded["message"])


def test_an_engine_that_exits_at_start_is_shown_crash_looping_with_its_exit_code(
    testbed: Testbed, ns: str
) -> None:
    # 100 KV blocks hold fewer tokens than maxModelLen: the engine exits at
    # start, as vLLM does, its cause followed by its API server's traceback.
    manifest = cluster_manifest("crash", replicas=1)
    manifest["spec"]["engine"]["extraArgs"] += ["--num-gpu-blocks-override", "100"]
    apply(testbed, ns, manifest)
    _says_why(testbed, ns, "crash", "EngineCrashLooping", "exits with code 1")
    # The engine's cause reaches status with the fix it points to, though
    # kubelet's 2 KB tail of the log (the termination message) holds only the
    # traceback after it: the operator read the run's log (pods/log), at once
    # or, a log read a moment after the run ended being empty, next pass.
    cause = 'saying "ValueError: To serve at least one request'

    def told() -> str | None:
        degraded = _degraded(testbed, ns, "crash", "EngineCrashLooping") or {}
        said = str(degraded.get("message", ""))
        return said if cause in said else None

    message = wait_for(told, what="the engine's cause in Degraded", timeout=60)
    assert "the engine of pod crash-r0-0 exits with code 1" in message
    assert "see kubectl logs crash-r0-0 --previous" in message
    assert "the KV cache cannot hold spec.engine.maxModelLen tokens" in message
    # The command the message names shows the engine's own error (the pod
    # runner's CRI log files, served by kwok as a kubelet serves them).
    previous = testbed.kubectl("logs", "crash-r0-0", "-n", ns, "--previous")
    assert "max seq len" in previous
    entry = cluster(testbed, ns, "crash")["status"]["replicaStatuses"][0]
    assert entry["state"] == "CrashLooping"
    assert entry["lastTermination"] == "pod crash-r0-0: exit code 1 (Error)"
    # kubelet's backoff restarts it (10 s after the first exit), and that is counted.
    wait_for(
        lambda: (
            cluster(testbed, ns, "crash")["status"]["replicaStatuses"][0].get(
                "containerRestarts", 0
            )
            >= 1
        ),
        what="crash's engine restarted once",
        timeout=60,
    )


def test_an_image_that_cannot_be_pulled_is_shown_with_the_fields_to_check(
    testbed: Testbed, ns: str
) -> None:
    image = "vllm/vllm-openai:doesnotexist"
    apply(testbed, ns, cluster_manifest("nopull", replicas=1, image=image))
    message = _says_why(testbed, ns, "nopull", "ImagePullFailing", "check spec.image")
    assert f"image {image} cannot be pulled" in message
    entry = cluster(testbed, ns, "nopull")["status"]["replicaStatuses"][0]
    assert entry["state"] == "ImagePullFailing"


def test_a_stale_unschedulable_condition_on_a_bound_pod_does_not_take_its_replica_out(
    testbed: Testbed, ns: str
) -> None:
    # kube-scheduler patches PodScheduled=False by name when a bind fails
    # because the pod was deleted meanwhile; a StatefulSet's same-named
    # successor, already bound and running, can take that stale write (kubelet
    # rewrites it later; kwok's stand-in never does). Seen in CI: a replica
    # moved to another node never became Ready again.
    manifest = cluster_manifest("stale", replicas=1)
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "stale", 1, timeout=90)
    stale = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "SchedulerError",
        "message": 'running Bind plugin "DefaultBinder": pods "stale-r0-0" not found',
    }
    testbed.kubectl(
        "patch", "pod", "stale-r0-0", "-n", ns, "--subresource=status",
        "-p", json.dumps({"status": {"conditions": [stale]}}),
    )  # fmt: skip
    # A scale-up makes the operator pass over the patched pod for certain.
    manifest["spec"]["replicas"] = 2
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "stale", 2, timeout=90)
    assert _degraded(testbed, ns, "stale", "Unschedulable") is None
    entry = cluster(testbed, ns, "stale")["status"]["replicaStatuses"][0]
    assert entry["state"] == "Serving", entry
    pod = get_json(testbed, "pod", "stale-r0-0", "-n", ns)
    assert condition_of(pod, "PodScheduled")["status"] == "False"  # still there


def test_pods_the_namespace_refuses_say_why_and_routers_meet_the_restricted_standard(
    testbed: Testbed, ns: str
) -> None:
    """A namespace that enforces the restricted Pod Security Standard. The
    routers (shoal's own image) run as it requires. vLLM's images run as
    root, so the engines' pods are refused at admission: the StatefulSet
    exists and makes no pod. Status says so, with the API server's words
    and the fields that fix it; set, the replica comes up."""
    testbed.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    apply(testbed, ns, cluster_manifest("psa", replicas=1))
    message = _says_why(testbed, ns, "psa", "PodsRefused", "cannot create its pods")
    assert message.startswith("StatefulSet psa-r0 cannot create its pods: pods ")
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "spec.engine.pod.securityContext" in message
    wait_for(
        lambda: (
            get_json(testbed, "deployment", "psa-router", "-n", ns)["status"].get(
                "availableReplicas"
            )
            == 2
        ),
        what="both router pods admitted and available",
    )

    # What the message asks for (an image that runs as non-root is the user's).
    restricted = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containerSecurityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    patch = json.dumps({"spec": {"engine": {"pod": restricted}}})
    testbed.kubectl("patch", "vlc", "psa", "-n", ns, "--type=merge", "-p", patch)
    wait_ready(testbed, ns, "psa", 1)
    assert _degraded(testbed, ns, "psa", "PodsRefused") is None


def test_router_pods_a_quota_refuses_say_why_from_the_deployment(testbed: Testbed, ns: str) -> None:
    """No pod fits the namespace's quota: the router Deployment's ReplicaSet
    is refused, which the Deployment reports as ReplicaFailure."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    apply(testbed, ns, quota)
    wait_for(
        lambda: (
            get_json(testbed, "resourcequota", "no-pods", "-n", ns).get("status", {}).get("hard")
        ),
        what="the quota counted",
    )
    apply(testbed, ns, cluster_manifest("quota", replicas=1))
    message = _says_why(testbed, ns, "quota", "PodsRefused", "exceeded quota")
    assert message.startswith("Deployment quota-router cannot create its pods: "), message
    assert "a ResourceQuota of the namespace is used up" in message
