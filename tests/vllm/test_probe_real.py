"""`shoal probe` against real vLLM 0.32: with its engine-core process stopped
(SIGSTOP, as a stuck kernel or a deadlock leaves it) `/health` still answers
200, and the probe, with its default deadlines, must say the engine is hung
and exit non-zero; after SIGCONT it must say healthy again and exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.vllm.conftest import Server

# vLLM's process title for its engine core (vllm/v1/engine/core.py, set with
# setproctitle; VLLM_PROCESS_NAME_PREFIX defaults to "VLLM").
ENGINE_CORE_TITLE = "VLLM::EngineCore"


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def engine_core_pid(api_server: int) -> int:
    """The EngineCore process among the API server's descendants."""
    pending, seen = [api_server], []
    while pending:
        pid = pending.pop()
        seen.append(pid)
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if title.startswith(ENGINE_CORE_TITLE):
            return pid
        pending += _children(pid)
    raise AssertionError(f"no {ENGINE_CORE_TITLE} process under {api_server} (saw {seen})")


def shoal_probe(url: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    """`shoal probe` with its default deadlines: exit code, report, seconds."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "probe", "--endpoint", url, "--output", "json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.stdout, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return done.returncode, report, elapsed


def test_shoal_probe_reports_a_stopped_engine_core_hung_and_healthy_after_sigcont(
    real: Server,
) -> None:
    code, report, healthy_took = shoal_probe(real.url)
    assert (code, report["reason"], report["canary"]) == (0, "Healthy", "ok"), report
    core = engine_core_pid(real.proc.pid)
    os.kill(core, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # The API server still says it is healthy: that is why the probe exists.
        assert httpx.get(real.url + "/health", timeout=5).status_code == 200
        code, hung, _ = shoal_probe(real.url)
        verdict_after = time.monotonic() - stopped_at
        assert code == 1, hung
        assert hung["health"] == "ok" and hung["canary"] == "timeout", hung
        assert hung["reason"] == "EngineHung" and not hung["healthy"], hung
        assert "no token was generated" in hung["detail"], hung
        assert hung["progressDuringCanary"] == 0, hung
        assert httpx.get(real.url + "/health", timeout=5).status_code == 200
    finally:
        os.kill(core, signal.SIGCONT)
    continued_at = time.monotonic()
    code, report, _ = shoal_probe(real.url)
    recovered_after = time.monotonic() - continued_at
    assert (code, report["reason"], report["canary"]) == (0, "Healthy", "ok"), report
    print(
        f"\nhealthy probe {healthy_took:.1f}s; SIGSTOP -> EngineHung verdict "
        f"{verdict_after:.1f}s; SIGCONT -> Healthy verdict {recovered_after:.1f}s"
    )
