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

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shoal.router.app import Discovery, Router
from shoal.router.config import RouterConfig
from shoal.router.tracing import Tracing
from tests.integration.procs import MODEL, router, set_fault, sims
from tests.router_served import router_client

FINE = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


class _RecordingEngine(BaseHTTPRequestHandler):
    """Answers every completion with `status`, keeping the headers it was sent."""

    seen: list[dict[str, str]]
    status = 200

    def do_GET(self) -> None:
        self._answer(200, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self._answer(self.status, json.dumps({"id": "cmpl-1", "choices": []}).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def recording_engine(*, status: int = 200) -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Engine", (_RecordingEngine,), {"seen": seen, "status": status})
    engine = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{engine.server_address[1]}", seen
    finally:
        engine.shutdown()


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
        # The setup is what the test needs: the first token long after the
        # engine's headers, which it sends at once (the router holds them
        # until the first token, so the client gets both together).
        assert first_at > 0.3, (headers_at, first_at)
        ttft, count = _histogram(front, "shoal_router_upstream_ttft_seconds")
        assert count == 1
        assert 0.5 * first_at < ttft <= first_at, (headers_at, ttft, first_at)
        # A plain answer comes whole: no time to its first token is claimed.
        httpx.post(front + "/v1/completions", json={**body, "stream": False}, timeout=60)
        assert _histogram(front, "shoal_router_upstream_ttft_seconds")[1] == 1


def _traced_router(engines: list[str], exporter: InMemorySpanExporter, **config: object) -> Router:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Router(
        RouterConfig.model_validate(config),
        Discovery(endpoints=engines),
        tracing=Tracing.on(provider),
    )


async def _ask(router_: Router, *requests: dict[str, str]) -> list[int]:
    await router_.start()
    try:
        async with router_client(router_) as client:
            await wait_for_scrape(router_)
            statuses = []
            for headers in requests:
                answer = await client.post("/v1/completions", json=FINE, headers=headers)
                await answer.read()
                statuses.append(answer.status)
            return statuses
    finally:
        await router_.stop()


async def wait_for_scrape(router_: Router) -> None:
    for _ in range(100):
        if router_.scraper.scrapes and router_.fleet.routable():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the router never scraped its replicas")


CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = "b7ad6b7169203331"


def test_a_traced_request_continues_the_clients_trace_down_to_the_engine() -> None:
    exporter = InMemorySpanExporter()
    with recording_engine() as (url, seen):
        router_ = _traced_router([url], exporter)
        traceparent = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
        statuses = asyncio.run(_ask(router_, {"traceparent": traceparent}, {}))
    assert statuses == [200, 200]
    spans = exporter.get_finished_spans()
    first = [s for s in spans if s.context.trace_id == int(CLIENT_TRACE, 16)]
    by_name = {s.name: s for s in first}
    assert set(by_name) == {"POST /v1/completions", "router.route", "router.upstream"}, by_name
    served = by_name["POST /v1/completions"]
    assert served.parent is not None and served.parent.span_id == int(CLIENT_PARENT, 16)
    assert served.attributes is not None and served.attributes["http.response.status_code"] == 200
    route, upstream = by_name["router.route"], by_name["router.upstream"]
    for child in (route, upstream):
        assert child.parent is not None and child.parent.span_id == served.context.span_id
    assert route.attributes is not None
    assert route.attributes["shoal.replica"] == url.removeprefix("http://")
    assert route.attributes["shoal.route.reason"] and route.attributes["shoal.route.policy"]
    # The engine's parent is the router's attempt, in the client's trace.
    sent = seen[0]["traceparent"]
    assert sent == f"00-{CLIENT_TRACE}-{upstream.context.span_id:016x}-01", sent
    # Without a traceparent the router starts a trace of its own.
    assert seen[1]["traceparent"].split("-")[1] not in ("", CLIENT_TRACE)
    assert len({s.context.trace_id for s in spans}) == 2


def test_each_attempt_is_a_span_and_a_failed_one_says_why() -> None:
    exporter = InMemorySpanExporter()
    with recording_engine() as (url, _), recording_engine(status=500) as (failing, _):
        router_ = _traced_router([failing, url], exporter, policy="round-robin")
        statuses = asyncio.run(_ask(router_, {}, {}))
    assert statuses == [200, 200]
    attempts = [s for s in exporter.get_finished_spans() if s.name == "router.upstream"]
    failed = [s for s in attempts if s.attributes and str(s.attributes["shoal.replica"]) in failing]
    assert failed and all(s.events and s.events[0].name == "exception" for s in failed)
    assert {s.attributes["shoal.attempt"] for s in failed if s.attributes} == {0}
    assert any(s.attributes and s.attributes.get("shoal.attempt") == 1 for s in attempts)


def test_untraced_the_router_passes_the_clients_trace_headers_on_unchanged(
    tmp_path: Path,
) -> None:
    with recording_engine() as (url, seen), router([url], tmp_path) as front:
        traceparent = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
        httpx.post(
            front + "/v1/completions", json=FINE, headers={"traceparent": traceparent}, timeout=10
        )
        assert seen[-1]["traceparent"] == traceparent
