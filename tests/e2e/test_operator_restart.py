"""An operator that dies mid-reconcile (killed by a test hook right after it
applied the first engine StatefulSet) and starts again converges: the fleet
completes, nothing is created twice, and what existed is kept, not replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.controller.context import TEST_HOOK_EXIT_CODE
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, namespace
from tests.e2e.operator_env import (
    children,
    cluster_manifest,
    delete_clusters,
    install_crd,
    names,
    operator,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-rs"


def test_an_operator_killed_after_the_first_statefulset_converges_without_duplicates(
    testbed: Testbed, tmp_path: Path
) -> None:
    install_crd(testbed)
    log = tmp_path / "operator.log"
    with namespace(testbed, PATTERN) as ns:
        try:
            hook = ["--test-exit-after-apply", "fleet-r0"]
            with operator(testbed, log, namespaces=[f"{PATTERN}-*"], extra=hook) as crashing:
                apply(testbed, ns, cluster_manifest("fleet", replicas=3, tensor=4))
                assert crashing.wait_exit(timeout=60) == TEST_HOOK_EXIT_CODE
            assert names(children(testbed, ns, "fleet", "statefulsets")) == ["fleet-r0"]
            assert not children(testbed, ns, "fleet", "deployments")
            first = get_json(testbed, "statefulset", "fleet-r0", "-n", ns)["metadata"]["uid"]

            with operator(testbed, log, namespaces=[f"{PATTERN}-*"]):
                wait_ready(testbed, ns, "fleet", 3)
                assert names(children(testbed, ns, "fleet", "statefulsets")) == [
                    "fleet-r0",
                    "fleet-r1",
                    "fleet-r2",
                ]
                assert (
                    get_json(testbed, "statefulset", "fleet-r0", "-n", ns)["metadata"]["uid"]
                    == first
                )
                pods = children(testbed, ns, "fleet", "pods")
                engines = [
                    p
                    for p in pods
                    if p["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
                ]
                assert names(engines) == ["fleet-r0-0", "fleet-r1-0", "fleet-r2-0"]
                assert len(pods) == 4  # and one router pod
                replicasets = get_json(testbed, "replicasets", "-n", ns)["items"]
                assert len(replicasets) == 1
                delete_clusters(testbed, ns)
        finally:
            delete_clusters(testbed, ns)
