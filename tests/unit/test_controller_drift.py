"""Drift: a live object differs from the desired manifest on the fields the
manifest sets. Pinned: a changed image or replica count is drift; defaults
the API server adds, quantities in its own spelling, other writers' own
fields and list items matched by name are not; an outdated object (another
recorded hash) is left to the rollout rather than reported as drift."""

from __future__ import annotations

import copy
from typing import Any

from shoal.controller.desired import drift, drifted, manifest_hash
from shoal.controller.names import ANNOTATION_SPEC_HASH


def _statefulset() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo-r0", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "args": ["--port", "8000"],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                            "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "1"}},
                        }
                    ],
                    "volumes": [{"name": "shm", "emptyDir": {}}],
                }
            },
        },
    }


def _live(desired: dict[str, Any]) -> dict[str, Any]:
    """As the API server returns it: no kind in a list, defaults, quantities as text."""
    live = copy.deepcopy(desired)
    del live["apiVersion"], live["kind"]
    live["metadata"].update(uid="u", resourceVersion="7", labels={"a": "b", "other": "x"})
    container = live["spec"]["template"]["spec"]["containers"][0]
    container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
    container["resources"]["limits"] = {"nvidia.com/gpu": "4", "cpu": "1000m"}
    container["env"].reverse()
    live["spec"]["podManagementPolicy"] = "OrderedReady"
    return live


def test_an_object_as_the_api_server_returns_it_has_not_drifted() -> None:
    desired = _statefulset()
    assert drift(desired, _live(desired)) == []


def test_a_changed_image_and_a_scaled_replica_count_are_drift() -> None:
    desired = _statefulset()
    live = _live(desired)
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.31.0"
    live["spec"]["replicas"] = 0
    assert drift(desired, live) == [
        "spec.replicas",
        "spec.template.spec.containers[engine].image",
    ]


def test_a_removed_env_entry_and_changed_args_are_drift() -> None:
    desired = _statefulset()
    live = _live(desired)
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "A", "value": "1"}]
    container["args"] = ["--port", "9000"]
    assert drift(desired, live) == [
        "spec.template.spec.containers[engine].args[1]",
        "spec.template.spec.containers[engine].env[B]",
    ]


def test_only_objects_still_carrying_the_desired_hash_are_reported_as_drifted() -> None:
    desired = _statefulset()
    stamped = _live(desired)
    stamped["metadata"]["annotations"] = {ANNOTATION_SPEC_HASH: manifest_hash(desired)}
    stamped["spec"]["replicas"] = 0
    outdated = copy.deepcopy(stamped)
    outdated["metadata"]["annotations"] = {ANNOTATION_SPEC_HASH: "older"}
    assert drifted([desired], {"StatefulSet/demo-r0": stamped}) == {
        "StatefulSet/demo-r0": ["spec.replicas"]
    }
    assert drifted([desired], {"StatefulSet/demo-r0": outdated}) == {}
    assert drifted([desired], {}) == {}
