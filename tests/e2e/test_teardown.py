"""Tearing down with the operator running, as a platform engineer cleans up,
on the real control plane: a namespace deleted with a serving VLLMCluster in
it, and the CRD deleted with VLLMClusters left.

kopf stops watching a namespace at the first status its deletion writes,
before the namespace controller deletes the VLLMClusters in it, when the
operator watches named namespaces (the chart's `operator.watchNamespaces`, or
a glob given to `shoal operator`); and it stops watching VLLMClusters once
their CRD is being deleted. Either way it never saw them go and never took
its finalizer off: the namespace, or the CRD, stayed Terminating for ever,
and the fleets ran on. A namespace made again under the same name is served
again."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.api.crd import CRD_NAME
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    cluster_manifest,
    complete,
    delete_clusters,
    install_crd,
    operator,
    router_url,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-teardown"
NAME = "chat"
# A namespace with one replica goes in about 15 s here; the bound is generous.
GONE_SECONDS = 90


def _serve(bed: Testbed, ns: str) -> None:
    apply(bed, ns, cluster_manifest(NAME, replicas=1))
    wait_ready(bed, ns, NAME, 1)
    assert complete(router_url(bed, ns, NAME), "hello").status_code == 200


def _created(bed: Testbed, ns: str) -> None:
    bed.kubectl("create", "namespace", ns)
    wait_for(
        lambda: bed.kubectl("get", "serviceaccount", "default", "-n", ns, check=False),
        what=f"default ServiceAccount in {ns}",
    )


@pytest.fixture
def team_ns(testbed: Testbed) -> Iterator[str]:
    """A namespace of its own, the CRD installed; whatever a failed test left
    in it released and deleted."""
    install_crd(testbed)
    ns = f"{PATTERN}-{uuid.uuid4().hex[:6]}"
    _created(testbed, ns)
    yield ns
    if testbed.kubectl("get", "namespace", ns, "--ignore-not-found", check=False).strip():
        delete_clusters(testbed, ns)
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("watch", ["name", "glob"])
def test_a_namespace_deleted_with_a_serving_cluster_goes_and_comes_back_served(
    testbed: Testbed, team_ns: str, tmp_path: Path, watch: str
) -> None:
    ns, log = team_ns, tmp_path / "operator.log"
    with operator(testbed, log, namespaces=[ns if watch == "name" else f"{PATTERN}-*"]):
        _serve(testbed, ns)
        testbed.kubectl("delete", "namespace", ns, f"--timeout={GONE_SECONDS}s")
        assert not testbed.kubectl("get", "namespace", ns, "--ignore-not-found").strip()
        # Who took the finalizer off is a race: kopf, when it saw the
        # VLLMCluster deleted before it stopped watching (rarely), or shoal.

        # The same name again: watched again, with nothing of the old
        # cluster left in the operator's memory.
        _created(testbed, ns)
        _serve(testbed, ns)
        status = get_json(testbed, "vllmcluster", NAME, "-n", ns)["status"]
        assert status["readyReplicas"] == 1


def test_an_operator_started_while_a_namespace_is_deleted_lets_it_go(
    testbed: Testbed, team_ns: str, tmp_path: Path
) -> None:
    """The namespace deleted while the operator is down (a rollout of the
    operator, say): its VLLMCluster waits, deleted, for the finalizer to come
    off. The operator started again releases it, though kopf does not watch a
    namespace that is already being deleted."""
    ns, log = team_ns, tmp_path / "operator.log"
    with operator(testbed, log, namespaces=[ns]):
        _serve(testbed, ns)
    testbed.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(
        lambda: get_json(testbed, "vllmcluster", NAME, "-n", ns)["metadata"].get(
            "deletionTimestamp"
        ),
        what=f"VLLMCluster {NAME} deleted with {ns}",
    )
    time.sleep(3)  # and still there: only the operator takes the finalizer off
    assert get_json(testbed, "vllmcluster", NAME, "-n", ns)["metadata"]["finalizers"]
    with operator(testbed, log, namespaces=[ns]):
        testbed.kubectl("wait", "--for=delete", f"namespace/{ns}", f"--timeout={GONE_SECONDS}s")


def test_the_crd_deleted_with_clusters_left_goes_and_takes_their_fleets(
    testbed: Testbed, team_ns: str, tmp_path: Path
) -> None:
    ns = team_ns
    try:
        with operator(testbed, tmp_path / "operator.log", namespaces=[f"{PATTERN}-*"]):
            _serve(testbed, ns)
            testbed.kubectl("delete", "crd", CRD_NAME, f"--timeout={GONE_SECONDS}s")
            # Their children go with them, by their owner references.
            wait_for(
                lambda: not get_json(testbed, "statefulsets,deployments", "-n", ns)["items"],
                what=f"the fleet in {ns} collected",
                timeout=GONE_SECONDS,
            )
    finally:
        # The CRD back for the tests after this one, once it has gone.
        unheld = json.dumps({"metadata": {"finalizers": None}})
        testbed.kubectl(
            "patch", "vllmcluster", NAME, "-n", ns, "--type=merge", "-p", unheld, check=False
        )
        testbed.kubectl("wait", "--for=delete", f"crd/{CRD_NAME}", "--timeout=60s", check=False)
        install_crd(testbed)
