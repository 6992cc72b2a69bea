"""Starting and stopping a testbed leaves no process behind, also when the
run that owns it is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shoal_testbed import procs
from shoal_testbed.cluster import REPO, Testbed, missing_binaries
from tests.conftest import require

pytestmark = pytest.mark.e2e


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and procs.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_down_stops_every_component(tmp_path: Path) -> None:
    require(not missing_binaries(), "testbed binaries missing: run `make testbed`")
    bed = Testbed(tmp_path / "bed", owned_by_caller=True)
    state = bed.up()
    assert bed.healthy()
    assert set(state.pids) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "podrunner",
    }
    assert _processes_mentioning(str(bed.dir))
    bed.down()
    assert _processes_mentioning(str(bed.dir)) == []
    assert Testbed.attach(bed.dir) is None
    assert (bed.logs / "audit.log").stat().st_size > 0, "the audit log stays for reading"


def test_a_killed_owner_takes_its_testbed_with_it(tmp_path: Path) -> None:
    require(not missing_binaries(), "testbed binaries missing: run `make testbed`")
    directory = tmp_path / "orphan"
    owner = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from shoal_testbed.cluster import Testbed
        Testbed(Path({str(directory)!r}), owned_by_caller=True).up()
        print("up", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO / "hack")}
    run = subprocess.Popen(
        [sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert run.stdout is not None
        assert run.stdout.readline().strip() == "up"
        assert len(_processes_mentioning(str(directory))) >= 5
        run.send_signal(signal.SIGKILL)  # as a CI timeout or an OOM kill would
        run.wait()
        procs.wait_until(
            lambda: not _processes_mentioning(str(directory)),
            what="the orphaned testbed to stop",
            timeout_seconds=30,
        )
    finally:
        if run.poll() is None:
            run.kill()
        Testbed(directory).down()
