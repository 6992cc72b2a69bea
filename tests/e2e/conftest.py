"""The real control plane for end-to-end tests.

Reuses a testbed started by `make testbed-up` (in .testbed/) when one answers;
otherwise starts a private one for this session, on free ports and its own
pod-IP range, and stops it at the end, also when tests fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_testbed.cluster import DEFAULT_DIR, Testbed, missing_binaries
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
