"""The Available condition on the testbed: with one replica of five that can
never schedule (four 8-GPU H100 nodes, TP8), `kubectl wait
--for=condition=Available` returns while Ready stays False, and raising
spec.minAvailable above what serves turns Available False."""

from __future__ import annotations

import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import cluster, cluster_manifest

pytestmark = pytest.mark.e2e

PATTERN = "shoal-avail"


def conditions(bed: Testbed, ns: str) -> dict[str, tuple[str, str]]:
    found = cluster(bed, ns, "avail").get("status", {}).get("conditions", [])
    return {c["type"]: (c["status"], c["reason"]) for c in found}


def test_a_fleet_with_a_replica_that_cannot_schedule_is_available_but_not_ready(
    testbed: Testbed, ns: str
) -> None:
    manifest = cluster_manifest("avail", replicas=5, tensor=8, minAvailable=2)
    apply(testbed, ns, manifest)
    testbed.kubectl("wait", "vlc/avail", "-n", ns, "--for=condition=Available", "--timeout=110s")
    found = conditions(testbed, ns)
    assert found["Available"] == ("True", "MinimumReplicasAvailable")
    assert found["Ready"][0] == "False"

    manifest["spec"]["minAvailable"] = 5
    apply(testbed, ns, manifest)
    wait_for(
        lambda: conditions(testbed, ns).get("Available") == ("False", "MinimumReplicasUnavailable"),
        what="Available False with minAvailable 5",
        timeout=30,
    )
