"""What the router observes of requests, in its metrics and traces:

- `shoal_router_upstream_ttft_seconds` is a stream's time to its first token
  (the first bytes of its body), not to its response headers, which vLLM and
  the simulator send before the prefill;
- with tracing on, each request is a W3C trace (started, or continued from
  the client's traceparent) with spans for the queue, the routing decision
  (the chosen replica and why) and each upstream attempt, and the engine gets
  a traceparent naming the attempt's span.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.integration.procs import MODEL, router, set_fault, sims


def _histogram(front: str, name: str) -> tuple[float, float]:
    """(sum, count) of a router histogram over its label sets."""
    total = count = 0.0
    for line in httpx.get(front + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def test_upstream_ttft_is_measured_at_a_streams_first_token(tmp_path: Path) -> None:
    with sims(1, tmp_path, time_scale=1) as urls, router(urls, tmp_path) as front:
        set_fault(urls[0], slowness=30)  # a slow prefill: headers long before the first token
        body = {"model": MODEL, "prompt": "word " * 2000, "max_tokens": 2, "stream": True}
        sent = time.monotonic()
        with httpx.stream("POST", front + "/v1/completions", json=body, timeout=60) as answer:
            headers_at = time.monotonic() - sent
            first_at = None
            for _ in answer.iter_raw():
                if first_at is None:
                    first_at = time.monotonic() - sent
        assert answer.status_code == 200 and first_at is not None
        # The setup is what the test needs: the first token well after the headers.
        assert first_at - headers_at > 0.3, (headers_at, first_at)
        ttft, count = _histogram(front, "shoal_router_upstream_ttft_seconds")
        assert count == 1
        assert headers_at + 0.5 * (first_at - headers_at) < ttft <= first_at, (
            headers_at,
            ttft,
            first_at,
        )
        # A plain answer comes whole: no time to its first token is claimed.
        httpx.post(front + "/v1/completions", json={**body, "stream": False}, timeout=60)
        assert _histogram(front, "shoal_router_upstream_ttft_seconds")[1] == 1
