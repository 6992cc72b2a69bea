"""The real control plane for end-to-end tests.

Reuses a testbed started by `make testbed-up` (in .testbed/) when one answers;
otherwise starts a private one for this session, on free ports and its own
pod-IP range, and stops it at the end, also when tests fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_testbed.cluster import DEFAULT_DIR, Testbed, bin_dir, missing_binaries
from shoal_testbed.prometheus import Prometheus
from tests.conftest import require


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    missing = missing_binaries()
    require(not missing, f"testbed binaries missing ({', '.join(missing)}): run `make testbed`")
    running = Testbed.attach(Path(os.environ.get("SHOAL_TESTBED_DIR", DEFAULT_DIR)))
    if running is not None:
        yield running
        return
    bed = Testbed(tmp_path_factory.mktemp("testbed"), owned_by_caller=True)
    bed.up()
    try:
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="session")
def prometheus(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """The testbed's Prometheus (hack/shoal_testbed/prometheus.py): the one
    `make testbed-up` started, else a private one for this session, scraping
    what the ServiceMonitors and PodMonitors in the API server select."""
    from shoal_testbed import prometheus as monitoring

    require(
        monitoring.binary("prometheus").exists(),
        "Prometheus missing: run `make prometheus`",
    )
    running = monitoring.attach(testbed.dir / "monitoring")
    if running is not None:
        yield running
        return
    directory = tmp_path_factory.mktemp("prometheus")
    server = monitoring.start(
        directory,
        kubeconfig=testbed.kubeconfig,
        kubectl_bin=bin_dir() / "kubectl",
        interval="2s",
        die_with_parent=True,
    )
    try:
        yield server
    finally:
        monitoring.stop(directory)


@pytest.fixture(scope="module")
def running_operator(
    request: pytest.FixtureRequest, testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The operator as a local process for a test module, watching namespaces
    named after the module's PATTERN (so modules never share clusters)."""
    from tests.e2e.operator_env import install_crd, operator

    install_crd(testbed)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with operator(testbed, log, namespaces=[f"{request.module.PATTERN}-*"]):
        yield


@pytest.fixture
def ns(request: pytest.FixtureRequest, testbed: Testbed, running_operator: None) -> Iterator[str]:
    """A fresh namespace the module's operator watches; its VLLMClusters are
    deleted while the operator still runs, so their finalizers go with them."""
    from tests.e2e.kube import namespace
    from tests.e2e.operator_env import delete_clusters

    with namespace(testbed, request.module.PATTERN) as name:
        try:
            yield name
        finally:
            delete_clusters(testbed, name)
