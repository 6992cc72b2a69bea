"""The tier says when a server died and why (its exit code and signal, and the
log lines around the first sign of death), instead of leaving every later test
to fail with "connection refused". Needs no real vLLM: a stand-in server dies
as vLLM does when its worker is killed by SIGILL."""

from __future__ import annotations

import sys
from pathlib import Path

from shoal.procs import HOST, start
from tests.vllm.conftest import Server, death_report

# What vLLM 0.32 prints when a worker dies, then the API server's own death.
_DYING = """
import os, signal, sys, time
print("INFO ... Starting vLLM API server", flush=True)
print("INFO ... GET /health 200", flush=True)
print("ERROR ... Worker proc VllmWorker-0 died unexpectedly (exit code: -4)", flush=True)
print("ERROR ... vllm.v1.engine.exceptions.EngineDeadError: EngineCore failed", flush=True)
os.kill(os.getpid(), signal.SIGILL)
"""


def test_a_dead_server_is_reported_with_its_signal_and_the_lines_that_say_why(
    tmp_path: Path,
) -> None:
    process = start([sys.executable, "-c", _DYING], log=tmp_path / "vllm.log", name="vllm")
    server = Server("real", f"http://{HOST}:1", 1, process)
    process.wait_exit(timeout=30)
    report = death_report(server)
    assert report is not None
    assert "exit code -4 (SIGILL)" in report
    assert "VllmWorker-0 died unexpectedly (exit code: -4)" in report
    assert "EngineDeadError" in report


def test_a_running_server_has_nothing_to_report(tmp_path: Path) -> None:
    script = "import time; time.sleep(60)"
    with start([sys.executable, "-c", script], log=tmp_path / "x.log", name="x") as process:
        assert death_report(Server("sim", f"http://{HOST}:1", 1, process)) is None
