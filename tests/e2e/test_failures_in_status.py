"""Failures in status, on the testbed's kwok nodes (the pod runner reports
containers as kubelet does): an engine that exits at start and an image that
cannot be pulled show up in `kubectl get vlc` and `kubectl describe vlc`
within a minute, with the reason, what to do, and a Warning Event."""

from __future__ import annotations

from typing import Any

import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import cluster, cluster_manifest, events, printed_columns

pytestmark = pytest.mark.e2e

PATTERN = "shoal-fail"


def _degraded(bed: Testbed, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    for found in cluster(bed, ns, name).get("status", {}).get("conditions", []):
        if found["type"] == "Degraded" and found["status"] == "True" and found["reason"] == reason:
            return dict(found)
    return None


def test_an_engine_that_exits_at_start_is_shown_crash_looping_with_its_exit_code(
    testbed: Testbed, ns: str
) -> None:
    # 100 KV blocks hold fewer tokens than maxModelLen: the engine exits at start, as vLLM does.
    manifest = cluster_manifest("crash", replicas=1)
    manifest["spec"]["engine"]["extraArgs"] += ["--num-gpu-blocks-override", "100"]
    apply(testbed, ns, manifest)
    degraded = wait_for(
        lambda: _degraded(testbed, ns, "crash", "EngineCrashLooping"),
        what="crash Degraded with EngineCrashLooping",
        timeout=60,
    )
    assert "the engine of pod crash-r0-0 exits with code 2" in degraded["message"]
    assert "see kubectl logs crash-r0-0 --previous" in degraded["message"]
    # The engine's last words reach status (terminationMessagePolicy
    # FallbackToLogsOnError), with the fix they point to.
    assert "the KV cache cannot hold spec.engine.maxModelLen tokens" in degraded["message"]
    # The command the message names shows the engine's own error (the pod
    # runner's CRI log files, served by kwok as a kubelet serves them).
    previous = testbed.kubectl("logs", "crash-r0-0", "-n", ns, "--previous")
    assert "fewer than max_model_len" in previous
    assert printed_columns(testbed, ns, "crash")["STATUS"] == "EngineCrashLooping"
    entry = cluster(testbed, ns, "crash")["status"]["replicaStatuses"][0]
    assert entry["state"] == "CrashLooping"
    assert entry["lastTermination"] == "pod crash-r0-0: exit code 2 (Error)"
    described = testbed.kubectl("describe", "vlc", "crash", "-n", ns)
    assert "EngineCrashLooping" in described and "exits with code 2" in described
    warnings = [e for e in events(testbed, ns, "crash") if e["type"] == "Warning"]
    assert "EngineCrashLooping" in [e["reason"] for e in warnings]
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
    degraded = wait_for(
        lambda: _degraded(testbed, ns, "nopull", "ImagePullFailing"),
        what="nopull Degraded with ImagePullFailing",
        timeout=60,
    )
    assert f"image {image} cannot be pulled" in degraded["message"]
    assert "check spec.image" in degraded["message"]
    assert printed_columns(testbed, ns, "nopull")["STATUS"] == "ImagePullFailing"
    entry = cluster(testbed, ns, "nopull")["status"]["replicaStatuses"][0]
    assert entry["state"] == "ImagePullFailing"
    described = testbed.kubectl("describe", "vlc", "nopull", "-n", ns)
    assert "ImagePullFailing" in described and "check spec.image" in described
    warnings = [e for e in events(testbed, ns, "nopull") if e["type"] == "Warning"]
    assert "ImagePullFailing" in [e["reason"] for e in warnings]
