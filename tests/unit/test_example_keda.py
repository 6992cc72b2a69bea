"""examples/keda/scaledobject.yaml, for KEDA users: it targets the
VLLMCluster as the built-in autoscaler recognises (so that it stands aside)
and scales on the routers' demand under the names they export. (No KEDA on
the testbed: this checks the example against shoal's own definitions.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from shoal.api import API_VERSION, KIND
from shoal.controller.autoscaler import SCALED_OBJECT_API, scales_cluster
from shoal.controller.identity import ClusterRef
from shoal.router.metrics import INFLIGHT, QUEUE_DEPTH

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "keda" / "scaledobject.yaml"


def test_the_keda_example_targets_the_cluster_on_the_routers_demand() -> None:
    scaled = yaml.safe_load(EXAMPLE.read_text())
    assert scaled["apiVersion"] == SCALED_OBJECT_API and scaled["kind"] == "ScaledObject"
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (API_VERSION, KIND)
    assert scales_cluster(scaled, ClusterRef(name=target["name"], namespace="ns", uid="u"))
    [trigger] = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert trigger["type"] == "prometheus"
    assert f"sum({INFLIGHT}{{" in query and f"sum({QUEUE_DEPTH}{{" in query, query
