"""A cluster's name on the real control plane: names the derived Services and
StatefulSets could not carry are refused at `kubectl apply` with the reason,
and the longest name admitted runs end to end (a multi-node replica, so its
worker StatefulSet `<name>-r0-w` and its pods' revision labels too)."""

from __future__ import annotations

import pytest
import yaml

from shoal.api.validation import MAX_NAME_LENGTH
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply
from tests.e2e.operator_env import children, cluster_manifest, names, router_url, wait_ready

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
