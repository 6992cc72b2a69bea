"""The operator is level-based for real, on the real control plane:

- children deleted by hand (router Service and ConfigMap, engines Service,
  PDB) come back within seconds, not at a periodic pass;
- drift is reverted, not propagated: `kubectl set image` on a replica's
  StatefulSet and `kubectl scale --replicas=0` are undone, the serving pod is
  kept, and an Event says so;
- a child write the API server refuses shows as a condition and a Warning
  Event on the VLLMCluster, with status still written;
- an edit that cannot run (a GPU product no node has) stops at the first
  replica, which gets its last good template back: the fleet stays at full
  strength and Progressing=False says why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    ENGINE_IMAGE,
    cluster,
    cluster_manifest,
    events,
    printed_columns,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-lvl"
# Within this, a change by hand is undone (the bar; the periodic pass
# is minutes apart).
REPAIR_SECONDS = 10


def _patch(bed: Testbed, ns: str, name: str, spec: dict[str, Any]) -> None:
    body = json.dumps({"spec": spec})
    bed.kubectl("patch", "vllmcluster", name, "-n", ns, "--type=merge", "-p", body)


def _conditions(bed: Testbed, ns: str, name: str) -> dict[str, dict[str, Any]]:
    status = cluster(bed, ns, name).get("status", {})
    return {c["type"]: c for c in status.get("conditions", [])}


def _exists(bed: Testbed, ns: str, kind: str, name: str) -> bool:
    return bool(bed.kubectl("get", kind, name, "-n", ns, "-o", "name", check=False).strip())


def test_children_deleted_by_hand_come_back_within_seconds(testbed: Testbed, ns: str) -> None:
    apply(testbed, ns, cluster_manifest("kids", replicas=1, tensor=4))
    wait_ready(testbed, ns, "kids", 1)
    deleted = [
        ("service", "kids-router"),
        ("configmap", "kids-router"),
        ("service", "kids-engines"),
        ("poddisruptionbudget", "kids-engines"),
    ]
    for kind, name in deleted:
        assert _exists(testbed, ns, kind, name), f"{kind}/{name} was never made"
    for kind, name in deleted:
        testbed.kubectl("delete", kind, name, "-n", ns, "--wait=true")
    wait_for(
        lambda: all(_exists(testbed, ns, kind, name) for kind, name in deleted),
        what="every deleted child back",
        timeout=REPAIR_SECONDS,
        interval=0.2,
    )


def test_set_image_and_scale_on_a_replica_are_reverted_and_the_serving_pod_kept(
    testbed: Testbed, ns: str
) -> None:
    apply(testbed, ns, cluster_manifest("drift", replicas=2, tensor=4))
    wait_ready(testbed, ns, "drift", 2)
    pod_uid = get_json(testbed, "pod", "drift-r0-0", "-n", ns)["metadata"]["uid"]

    testbed.kubectl("set", "image", "sts/drift-r0", "engine=vllm/vllm-openai:v0.31.0", "-n", ns)

    def image_restored() -> bool:
        sts = get_json(testbed, "statefulset", "drift-r0", "-n", ns)
        containers = sts["spec"]["template"]["spec"]["containers"]
        engine = next(c for c in containers if c["name"] == "engine")
        return bool(engine["image"] == ENGINE_IMAGE)

    wait_for(image_restored, what="drift-r0's image restored", timeout=REPAIR_SECONDS, interval=0.2)
    assert "DriftReverted" in [e["reason"] for e in events(testbed, ns, "drift")]

    testbed.kubectl("scale", "sts/drift-r1", "--replicas=0", "-n", ns)
    wait_for(
        lambda: get_json(testbed, "statefulset", "drift-r1", "-n", ns)["spec"]["replicas"] == 1,
        what="drift-r1 scaled back to 1",
        timeout=REPAIR_SECONDS,
        interval=0.2,
    )
    wait_ready(testbed, ns, "drift", 2)
    pod = get_json(testbed, "pod", "drift-r0-0", "-n", ns)
    assert pod["metadata"]["uid"] == pod_uid, "the serving pod was replaced by the drift"
    assert pod["spec"]["containers"][0]["image"] == ENGINE_IMAGE


def test_a_child_write_the_api_server_refuses_is_a_condition_and_an_event(
    testbed: Testbed, ns: str
) -> None:
    apply(testbed, ns, cluster_manifest("refused", replicas=1, tensor=4))
    wait_ready(testbed, ns, "refused", 1)
    # Passed through to the StatefulSet, where the API server refuses it.
    _patch(testbed, ns, "refused", {"engine": {"env": [{"value": "no name"}]}})
    generation = cluster(testbed, ns, "refused")["metadata"]["generation"]

    def reported() -> dict[str, Any] | None:
        found = _conditions(testbed, ns, "refused").get("SpecValid", {})
        return found if found.get("status") == "False" else None

    condition = wait_for(reported, what="SpecValid=False", timeout=REPAIR_SECONDS, interval=0.2)
    assert condition["reason"] == "ChildRefused"
    assert "StatefulSet refused-r0" in condition["message"]
    # The API server's words, naming the child's field (after the env shoal sets).
    assert ".env[" in condition["message"] and "name: Required value" in condition["message"]
    status = cluster(testbed, ns, "refused")["status"]
    assert status["observedGeneration"] == generation
    warnings = [e for e in events(testbed, ns, "refused") if e["type"] == "Warning"]
    assert "ChildRefused" in [e["reason"] for e in warnings]
    # The fleet keeps serving what it ran.
    assert printed_columns(testbed, ns, "refused")["READY"] == "1"


def _progressing(bed: Testbed, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    found = _conditions(bed, ns, name).get("Progressing", {})
    return found if found.get("status") == "False" and found.get("reason") == reason else None


def _engine_args(bed: Testbed, ns: str, pod: str) -> list[str]:
    spec = get_json(bed, "pod", pod, "-n", ns)["spec"]
    engine = next(c for c in spec["containers"] if c["name"] == "engine")
    return list(engine.get("args") or []) + list(engine.get("command") or [])


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"gpu": {"product": "NVIDIA-B300-SXM6-AC"}}, id="gpu-product-no-node-has"),
        pytest.param(
            {"engine": {"maxModelLen": 8192, "extraArgs": ["--no-such-flag"]}},
            id="flag-the-engine-refuses",
        ),
    ],
)
def test_an_edit_that_cannot_run_is_rolled_back_on_its_first_replica_and_the_fleet_kept(
    testbed: Testbed, ns: str, edit: dict[str, Any]
) -> None:
    name = "unrun"
    apply(
        testbed,
        ns,
        cluster_manifest(name, replicas=2, tensor=4, rollout={"progressDeadlineSeconds": 20}),
    )
    wait_ready(testbed, ns, name, 2)
    kept = get_json(testbed, "statefulset", f"{name}-r1", "-n", ns)["spec"]["template"]
    _patch(testbed, ns, name, edit)
    condition = wait_for(
        lambda: _progressing(testbed, ns, name, "RolledBack"),
        what="Progressing=False RolledBack",
        timeout=90,
        interval=0.5,
    )
    assert "replica 0" in condition["message"]
    assert "gave it its last good template back" in condition["message"]
    # Back at full strength on the last good template, and still paused.
    wait_ready(testbed, ns, name, 2, timeout=90)
    assert _progressing(testbed, ns, name, "RolledBack") is not None
    pod = get_json(testbed, "pod", f"{name}-r0-0", "-n", ns)
    selector = pod["spec"].get("nodeSelector") or {}
    assert selector.get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3"
    assert "--no-such-flag" not in _engine_args(testbed, ns, f"{name}-r0-0")
    # The rollout never reached the other replica (self-healing may restart it
    # on a loaded machine, on its old template).
    assert get_json(testbed, "statefulset", f"{name}-r1", "-n", ns)["spec"]["template"] == kept
    told = events(testbed, ns, name)
    assert not [e for e in told if e["message"].startswith("replacing replica 1")]
    assert "RolledBack" in [e["reason"] for e in told if e["type"] == "Warning"]
