"""The testbed's process handling on this machine: nothing is left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from shoal_testbed import procs


def _pids_in_group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().split(")")[-1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def test_stop_group_stops_children_that_ignore_sigterm(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time, signal; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        print("ready", flush=True)
        time.sleep(600)
    """)
    log = tmp_path / "p.log"
    process = procs.start([sys.executable, "-c", script], log_path=log)
    # The log starts with the command line, so look for a line of its own.
    procs.wait_until(
        lambda: "ready" in log.read_text().splitlines(), what="child", timeout_seconds=20
    )
    assert len(_pids_in_group(process.pid)) == 2
    procs.stop_group(process.pid, grace_seconds=0.5)
    process.wait(timeout=5)
    assert _pids_in_group(process.pid) == []


def test_processes_owned_by_a_run_die_with_it(tmp_path: Path) -> None:
    # A stand-in for a pytest run that owns a testbed and is killed outright.
    pid_file = tmp_path / "child.pid"
    owner = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(procs.__file__).parents[1])!r})
        from pathlib import Path
        from shoal_testbed import procs
        child = procs.start([sys.executable, "-c", "import time; time.sleep(600)"],
                            log_path=Path({str(tmp_path / "c.log")!r}), die_with_parent=True)
        Path({str(pid_file)!r}).write_text(str(child.pid))
        time.sleep(600)
    """)
    runner = subprocess.Popen([sys.executable, "-c", owner])
    procs.wait_until(pid_file.exists, what="owner", timeout_seconds=20)
    child = int(pid_file.read_text())
    assert procs.alive(child)
    runner.kill()
    runner.wait()
    procs.wait_until(lambda: not procs.alive(child), what="child exit", timeout_seconds=10)
    assert not procs.alive(child)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = {procs.free_port() for _ in range(20)}
    assert len(ports) > 15
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
