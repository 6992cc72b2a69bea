"""A cluster's name on the real control plane: names the derived Services and
StatefulSets could not carry are refused at `kubectl apply` with the reason,
and the longest name admitted runs end to end (a multi-node replica, so its
worker StatefulSet `<name>-r0-w` and its pods' revision labels too)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from shoal.api.validation import MAX_NAME_LENGTH
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    children,
    cluster,
    cluster_manifest,
    events,
    names,
    router_url,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-names"
LONGEST = "llama-405b-" + "x" * (MAX_NAME_LENGTH - len("llama-405b-"))
MODEL = "meta-llama/Llama-3.1-405B-Instruct"


def _refusal(bed: Testbed, ns: str, name: str) -> str:
    text = yaml.safe_dump(cluster_manifest(name, replicas=1, tensor=8))
    with pytest.raises(RuntimeError) as refused:
        bed.kubectl("apply", "-n", ns, "-f", "-", input_text=text)
    return str(refused.value)


def test_a_name_starting_with_a_digit_is_refused_at_apply_saying_why(
    testbed: Testbed, ns: str
) -> None:
    error = _refusal(testbed, ns, "70b")
    assert "metadata.name must be a DNS-1035 label" in error
    assert "starting with a letter" in error


def test_a_60_character_name_is_refused_at_apply_with_the_limit(testbed: Testbed, ns: str) -> None:
    error = _refusal(testbed, ns, "llama-70b-" + "x" * 50)
    assert f"metadata.name has 60 characters, at most {MAX_NAME_LENGTH} fit" in error
    assert "controller-revision-hash" in error


def test_the_longest_admitted_name_gets_its_statefulsets_pods_and_router_service(
    testbed: Testbed, ns: str
) -> None:
    assert len(LONGEST) == MAX_NAME_LENGTH
    apply(testbed, ns, cluster_manifest(LONGEST, replicas=1, tensor=16, model=MODEL))
    wait_ready(testbed, ns, LONGEST, 1)
    sets = children(testbed, ns, LONGEST, "statefulsets")
    assert names(sets) == [f"{LONGEST}-r0", f"{LONGEST}-r0-w"]
    engine_pods = [
        pod
        for pod in children(testbed, ns, LONGEST, "pods")
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
    ]
    assert names(engine_pods) == [f"{LONGEST}-r0-0", f"{LONGEST}-r0-w-1"]
    for pod in engine_pods:
        revision = pod["metadata"]["labels"]["controller-revision-hash"]
        assert revision.startswith(pod["metadata"]["name"].rsplit("-", 1)[0] + "-")
    services = names(children(testbed, ns, LONGEST, "services"))
    assert f"{LONGEST}-router" in services and f"{LONGEST}-engines" in services
    assert router_url(testbed, ns, LONGEST)


def _spec_valid(bed: Testbed, ns: str, name: str) -> dict[str, Any]:
    for found in cluster(bed, ns, name).get("status", {}).get("conditions", []):
        if found["type"] == "SpecValid":
            return dict(found)
    return {}


def test_names_taken_by_someone_elses_objects_are_left_alone_and_status_says_so(
    testbed: Testbed, ns: str
) -> None:
    """A user's own Service and ConfigMap happen to be called `chat-router`:
    a VLLMCluster `chat` must not take them over (and its deletion must not
    take them with it). It says which names are taken and how to fix it, and
    runs once they are free."""
    theirs = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "chat-router"},
            "spec": {"selector": {"app": "mine"}, "ports": [{"port": 80}]},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "chat-router"},
            "data": {"mine": "yes"},
        },
    ]
    apply(testbed, ns, *theirs)
    apply(testbed, ns, cluster_manifest("chat", replicas=1))
    found = wait_for(
        lambda: (c := _spec_valid(testbed, ns, "chat")).get("reason") == "NameTaken" and c,
        what="SpecValid NameTaken",
    )
    assert found["status"] == "False"
    assert "Service chat-router" in found["message"], found
    assert "ConfigMap chat-router" in found["message"], found
    assert "rename" in found["message"], found
    service = get_json(testbed, "service", "chat-router", "-n", ns)
    assert service["spec"]["selector"] == {"app": "mine"}
    assert not service["metadata"].get("ownerReferences"), service["metadata"]
    configmap = get_json(testbed, "configmap", "chat-router", "-n", ns)
    assert configmap["data"] == {"mine": "yes"}
    assert not configmap["metadata"].get("ownerReferences"), configmap["metadata"]
    assert "NameTaken" in [e["reason"] for e in events(testbed, ns, "chat")]

    # Freed, the names are shoal's: the fleet comes up.
    testbed.kubectl("delete", "service,configmap", "chat-router", "-n", ns)
    wait_ready(testbed, ns, "chat", 1)
    assert _spec_valid(testbed, ns, "chat")["status"] == "True"
