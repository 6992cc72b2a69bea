"""`shoal demo --kubernetes`, the second half of `make demo`, as a new user
runs it: its own testbed, helm install, a VLLMCluster Ready with its warm
replicas, requests through the router, scale down, clean-up."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from shoal_testbed.cluster import REPO, missing_binaries
from tests.conftest import require

pytestmark = pytest.mark.e2e


def test_kubernetes_demo_runs_end_to_end() -> None:
    require(not missing_binaries(), "testbed binaries missing: run `make testbed`")
    done = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "demo", "--kubernetes"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
        env={**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"},
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    # kubectl get vllmclusters: 3 replicas, 3 ready, 3 warm.
    assert re.search(r"^demo\s+3\s+3\s+3\s+1\s+1\s", out, re.M), out
    routed = re.findall(r"^\s*(\d+) tenant \d -> (\S+)$", out, re.M)
    assert sum(int(n) for n, _ in routed) == 12
    assert all(replica.startswith("demo-r") for _, replica in routed), routed
    assert re.search(r"^demo\s+2\s+2\s+2\s", out, re.M), "scaled down to 2"
