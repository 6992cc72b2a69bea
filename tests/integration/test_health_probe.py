"""The operator's health checks against simulated engines with faults: each
fault detected with its reason, slowness under the deadline rightly ignored."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from shoal.engine.client import EngineClient
from shoal.health.assess import Assessment, HealthTracker, Outcome, Reason
from shoal.health.probe import probe
from tests.integration.procs import MODEL, engine_metric, set_fault, sims


def assessment(url: str, *, canary_timeout: float = 1.0) -> tuple[Outcome, Assessment]:
    async def once() -> tuple[Outcome, Assessment]:
        async with EngineClient() as engine:
            result = await probe(
                engine, url, model=MODEL, health_timeout=2, canary_timeout=canary_timeout
            )
        verdict = HealthTracker(stall_seconds=30, failure_threshold=1).observe(result)
        return result.canary, verdict

    return asyncio.run(once())


def assess(url: str, *, canary_timeout: float = 1.0) -> tuple[Outcome, Reason]:
    canary, verdict = assessment(url, canary_timeout=canary_timeout)
    return canary, verdict.reason


def test_each_fault_is_detected_with_its_reason(tmp_path: Path) -> None:
    with sims(4, tmp_path, time_scale=1.0) as urls:
        healthy, hung, failing, broken = urls
        set_fault(hung, hang=True)
        set_fault(failing, error_rate=1.0)
        set_fault(broken, metrics="error")
        assert assess(healthy) == (Outcome.OK, Reason.HEALTHY)
        assert assess(hung) == (Outcome.TIMEOUT, Reason.HUNG)
        assert assess(failing)[1] is Reason.FAILING
        assert assess(broken)[1] is Reason.METRICS
        # Only connection-level failures may mean the operator is cut off.
        assert not any(assessment(u)[1].connection_level for u in (hung, failing, broken))
        set_fault(broken, metrics="ok", connections="reset")
        _, verdict = assessment(broken)
        assert (verdict.reason, verdict.connection_level) == (Reason.DEAD, True)
        assert verdict.detail == "/health refused"
        urls.kill(0)
        _, verdict = assessment(healthy)
        assert (verdict.reason, verdict.connection_level) == (Reason.DEAD, True)


def test_slow_but_working_engines_are_left_alone(tmp_path: Path) -> None:
    # Four sequence slots: under load, a canary waits in the queue.
    with sims(1, tmp_path, time_scale=1.0, extra=["--max-num-seqs", "4"]) as urls:
        set_fault(urls[0], slowness=3.0)
        assert assess(urls[0], canary_timeout=5.0) == (Outcome.OK, Reason.HEALTHY)
        # Loaded so the canary queues past its deadline, yet tokens keep coming.
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=60) as client:
                while not stop.is_set():
                    client.post(
                        urls[0] + "/v1/completions",
                        json={
                            "model": MODEL,
                            "prompt": "busy " * 200,
                            "max_tokens": 64,
                            "ignore_eos": True,
                        },
                    )

        workers = [threading.Thread(target=load) for _ in range(24)]
        for worker in workers:
            worker.start()
        try:
            deadline = time.monotonic() + 20
            while engine_metric(urls[0], "vllm:num_requests_waiting") < 8:
                assert time.monotonic() < deadline, "the load never queued"
                time.sleep(0.1)
            canary, reason = assess(urls[0], canary_timeout=0.05)
            assert canary is Outcome.TIMEOUT, "the load did not delay the canary: test is void"
            assert reason is Reason.HEALTHY, (canary, reason)
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=60)


def test_shoal_probe_reports_a_hang_and_recovery(tmp_path: Path) -> None:
    with sims(1, tmp_path, time_scale=1.0) as urls:

        def run() -> tuple[int, dict[str, object]]:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "shoal.cli",
                    "probe",
                    "--endpoint",
                    urls[0],
                    "--canary-timeout",
                    "1",
                    "--output",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            return done.returncode, json.loads(done.stdout.splitlines()[-1])

        code, report = run()
        assert code == 0 and report["reason"] == "Healthy"
        set_fault(urls[0], hang=True)
        code, report = run()
        assert code == 1 and report["reason"] == "EngineHung" and report["health"] == "ok"
        set_fault(urls[0], hang=False)
        code, report = run()
        assert code == 0 and report["reason"] == "Healthy"
