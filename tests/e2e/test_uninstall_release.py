"""`shoal release` (the chart's post-delete hook) on the real API server: it
waits while an operator pod is left (that operator would put the finalizer
back), then removes shoal's finalizer, and only shoal's, from a cluster the
operator had taken; an operator started again takes the cluster back. The
whole `helm uninstall` is in test_chart_install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.controller.names import FINALIZER
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, namespace, wait_for
from tests.e2e.operator_env import cluster_manifest, install_crd, operator

pytestmark = pytest.mark.e2e

PATTERN = "shoal-rel"
OTHER = "example.com/keep"
STAND_IN = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "operator", "labels": {"app": "stand-in-operator"}},
    "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "inf"]}]},
}


def release(bed: Testbed, ns: str) -> subprocess.CompletedProcess[str]:
    args = [f"--operator-namespace={ns}", "--operator-selector=app=stand-in-operator"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal.cli",
            "release",
            *args,
            "--wait-seconds=2",
            "--namespace",
            ns,
        ],
        env={**os.environ, "KUBECONFIG": str(bed.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def finalizers(bed: Testbed, ns: str) -> list[str]:
    found: list[str] = get_json(bed, "vllmcluster", "fleet", "-n", ns)["metadata"].get(
        "finalizers", []
    )
    return found


def test_release_waits_for_the_operators_pods_and_removes_only_shoals_finalizer(
    testbed: Testbed, tmp_path: Path
) -> None:
    install_crd(testbed)
    with namespace(testbed, PATTERN) as ns:
        try:
            with operator(testbed, tmp_path / "operator.log", namespaces=[ns]):
                apply(testbed, ns, cluster_manifest("fleet", replicas=1))
                wait_for(lambda: FINALIZER in finalizers(testbed, ns), what="shoal's finalizer")
            # Another controller's finalizer first: shoal's is not at index 0.
            add = [{"op": "add", "path": "/metadata/finalizers/0", "value": OTHER}]
            testbed.kubectl(
                "patch", "vllmcluster", "fleet", "-n", ns, "--type=json", "-p", json.dumps(add)
            )
            apply(testbed, ns, STAND_IN)

            held = release(testbed, ns)
            assert held.returncode == 1, held
            assert "operator pods still in" in held.stdout and "operator" in held.stdout, (
                held.stdout
            )
            assert finalizers(testbed, ns) == [OTHER, FINALIZER]

            testbed.kubectl("delete", "pod", "operator", "-n", ns, "--grace-period=0", "--force")
            wait_for(
                lambda: (
                    not get_json(testbed, "pods", "-n", ns, "-l", "app=stand-in-operator")["items"]
                ),
                what="the stand-in operator pod gone",
            )
            done = release(testbed, ns)
            assert done.returncode == 0, done
            assert f"released {ns}/fleet" in done.stdout and "1 of 1" in done.stdout, done.stdout
            assert finalizers(testbed, ns) == [OTHER]

            # Run again (a retried hook): nothing left to release.
            again = release(testbed, ns)
            assert again.returncode == 0 and "0 of 1" in again.stdout, again

            # An operator installed again takes the cluster back.
            with operator(testbed, tmp_path / "operator-again.log", namespaces=[ns]):
                wait_for(
                    lambda: finalizers(testbed, ns) == [OTHER, FINALIZER],
                    what="shoal's finalizer back",
                )
        finally:
            # Whatever happened, the namespace can go.
            clear = json.dumps({"metadata": {"finalizers": None}})
            testbed.kubectl(
                "patch", "vllmcluster", "fleet", "-n", ns, "--type=merge", "-p", clear, check=False
            )
