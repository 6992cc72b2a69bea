"""cache-aware counts the prefill it has queued on each replica: a request
does not wait behind a long prompt another replica could skip."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from shoal.procs import wait_until
from tests.integration.procs import MODEL, engine_metric, router, sims

LONG = " ".join(f"w{i % 97}" for i in range(6000))  # ~6k tokens: 0.3 s of H100 prefill


def test_short_requests_avoid_a_replica_prefilling_a_long_prompt(tmp_path: Path) -> None:
    # At 1/20 of real time the long prompt's prefill takes ~6 s of wall time,
    # while a short request takes a fraction of a second on an idle engine.
    with (
        sims(2, tmp_path, time_scale=0.05) as urls,
        router(urls, tmp_path, config={"policy": "cache-aware"}) as front,
    ):
        long_replica: list[str] = []

        def send_long() -> None:
            body = {"model": MODEL, "prompt": LONG, "max_tokens": 2, "stream": True}
            with httpx.stream("POST", front + "/v1/completions", json=body, timeout=120) as r:
                assert r.status_code == 200
                long_replica.append(r.headers["x-shoal-replica"])
                r.read()

        def at_an_engine() -> bool:
            # The router answers a stream's headers only with its first token,
            # after the prefill, so the engines say when the long prompt is in.
            names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
            return any(engine_metric(u, n) >= 1 for u in urls for n in names)

        thread = threading.Thread(target=send_long)
        thread.start()
        wait_until(at_an_engine, what="the long prompt at an engine", timeout=30, interval=0.05)
        started = time.monotonic()
        placed = []
        with httpx.Client(timeout=60) as client:
            for i in range(6):
                body = {"model": MODEL, "prompt": f"short question {i}", "max_tokens": 2}
                response = client.post(front + "/v1/completions", json=body)
                assert response.status_code == 200, response.text
                placed.append(response.headers["x-shoal-replica"])
        shorts_took = time.monotonic() - started
        long_running = thread.is_alive()
        thread.join(60)
        assert long_running, "the long prefill ended before the short requests were placed"
        assert long_replica[0] not in placed, (long_replica, placed)
        assert shorts_took < 5, shorts_took
        # Counted at the engines: one served the long prompt alone.
        served = sorted(engine_metric(u, "vllm:request_success_total") for u in urls)
        assert served == [1, 6]
