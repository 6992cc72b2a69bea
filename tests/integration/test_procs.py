"""The toolbox the tests and benchmarks start processes with (shoal.procs):
a stop always ends the process, a wait fails at once and says why when its
process died, a timeout says what it waited for, the router runs on the
configuration it was given, and children die with whoever started them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shoal.procs import (
    ProcessExited,
    free_port,
    free_ports,
    start,
    start_router,
    wait_http,
    wait_until,
)

IGNORE_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_free_ports_are_distinct() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50


def test_stop_kills_a_process_that_ignores_sigterm_after_its_grace(tmp_path: Path) -> None:
    script = IGNORE_SIGTERM + "print('ready', flush=True); time.sleep(600)"
    process = start([sys.executable, "-c", script], log=tmp_path / "p.log", grace=0.5)
    wait_until(lambda: "ready" in process.log.read_text(), what="the script", timeout=20)
    started = time.monotonic()
    assert process.stop() == -9
    assert time.monotonic() - started < 5
    assert not process.alive()


def test_a_wait_on_a_process_that_exited_fails_at_once_with_its_log(tmp_path: Path) -> None:
    script = "print('cannot bind: boom'); raise SystemExit(3)"
    process = start([sys.executable, "-c", script], log=tmp_path / "p.log", name="boomer")
    started = time.monotonic()
    with pytest.raises(ProcessExited) as raised:
        wait_http(f"http://127.0.0.1:{free_port()}/health", timeout=60, process=process)
    assert time.monotonic() - started < 10
    assert "boomer exited with 3" in str(raised.value)
    assert "cannot bind: boom" in str(raised.value)


def test_a_wait_that_times_out_says_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match=r"the moon \(last: 0\)"):
        wait_until(lambda: 0, what="the moon", timeout=0.3, interval=0.1)
    assert wait_until(lambda: [1], what="a list", timeout=1) == [1]


def test_the_router_runs_on_the_config_it_is_given(tmp_path: Path) -> None:
    config = {"policy": "round-robin"}
    with start_router(log=tmp_path / "edge.log", config=config, endpoints=["http://x:1"]) as router:
        router.wait_http("/health", timeout=20)
        written = tmp_path / "edge.json"
        assert json.loads(written.read_text()) == config
        argv = list(router.popen.args)  # type: ignore[arg-type]
        assert argv[argv.index("--config") + 1] == str(written)
    assert not router.alive()


def test_children_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    owner = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from shoal.procs import start
        child = start([sys.executable, "-c", "import time; time.sleep(600)"],
                      log=Path({str(tmp_path / "c.log")!r}))
        Path({str(pid_file)!r}).write_text(str(child.pid))
        time.sleep(600)
    """)
    runner = subprocess.Popen([sys.executable, "-c", owner])
    try:
        wait_until(pid_file.exists, what="the owner's child", timeout=20, interval=0.1)
        child = int(pid_file.read_text())
        assert _alive(child)
    finally:
        runner.kill()
        runner.wait()
    wait_until(lambda: not _alive(child), what="the child's exit", timeout=10, interval=0.1)
