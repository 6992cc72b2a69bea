"""The testbed with its real node (kubelet + containerd, docs/real-node.md).

Reuses a testbed started by `make testbed-up` when it has the real node;
otherwise starts a private one with the node for this session and stops it at
the end (`make testbed-down`'s teardown, checked to leave nothing behind). A
reused node first takes up images rebuilt since it started (same names, new
IDs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_testbed import nodehost, prometheus
from shoal_testbed.cluster import DEFAULT_DIR, REPO, Testbed, bin_dir, missing_binaries
from tests.conftest import require


@pytest.fixture(scope="session")
def node_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    missing = missing_binaries() + nodehost.missing(REPO, bin_dir())
    if not prometheus.crds_dir().is_dir():
        missing.append("prometheus-operator's monitor CRDs (make prometheus)")
    require(not missing, f"the real node needs: {'; '.join(missing)}: run `make node-e2e`")
    running = Testbed.attach(Path(os.environ.get("SHOAL_TESTBED_DIR", DEFAULT_DIR)))
    # Short of disk, the node's kubelet removes the images mid-tier and every
    # later pod fails to start: say so once, up front.
    short = nodehost.disk_shortfall(running.dir if running else tmp_path_factory.getbasetemp())
    if short is not None:
        pytest.fail(short, pytrace=False)
    if running is not None and running.state is not None and running.state.real_node:
        nodehost.sync_images(running.state.node_layout(), repo=REPO)
        yield running
        return
    bed = Testbed(tmp_path_factory.mktemp("testbed"), owned_by_caller=True, real_node=True)
    state = bed.up()
    try:
        yield bed
    finally:
        bed.down()
        # `make testbed-down` leaves nothing of the node behind.
        left = nodehost.leftovers(state.node_layout())
        assert not left, f"the real node's teardown left: {left}"
