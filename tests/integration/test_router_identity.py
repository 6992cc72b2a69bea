"""A client's request identity reaches the engine, and the engine's key is
the router's to give:

- X-Request-Id is kept from the client, or generated, sent to the engine and
  returned on every answer (errors included);
- traceparent and tracestate are forwarded;
- X-Forwarded-For gains the client's address, X-Forwarded-Proto is set;
- engines get the router's engine API key, never the client's key.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.integration.procs import MODEL, router

FINE = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


class _RecordingEngine(BaseHTTPRequestHandler):
    """Answers every completion, keeping the headers it was sent."""

    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self._answer(json.dumps({"id": "cmpl-1", "choices": []}).encode())

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _engine() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Engine", (_RecordingEngine,), {"seen": seen})
    engine = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{engine.server_address[1]}", seen
    finally:
        engine.shutdown()


def test_request_ids_and_trace_context_reach_the_engine_and_ids_come_back(
    tmp_path: Path,
) -> None:
    with _engine() as (url, seen), router([url], tmp_path) as front:
        kept = httpx.post(
            front + "/v1/completions",
            json=FINE,
            headers={
                "X-Request-Id": "client-id-1",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "tracestate": "vendor=value",
                "X-Forwarded-For": "203.0.113.7",
            },
            timeout=10,
        )
        assert kept.status_code == 200 and kept.headers["x-request-id"] == "client-id-1"
        assert seen[-1]["x-request-id"] == "client-id-1"
        assert seen[-1]["traceparent"].startswith("00-0af7651916cd43dd")
        assert seen[-1]["tracestate"] == "vendor=value"
        assert seen[-1]["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
        assert seen[-1]["x-forwarded-proto"] == "http"

        generated = httpx.post(front + "/v1/completions", json=FINE, timeout=10)
        assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])
        assert seen[-1]["x-request-id"] == generated.headers["x-request-id"]
        assert seen[-1]["x-forwarded-for"] == "127.0.0.1"

        refused = httpx.post(front + "/v1/completions", content=b"{", timeout=10)
        assert refused.status_code == 400
        assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"])
        echoed = httpx.post(
            front + "/v1/completions",
            content=b"[]",
            headers={"X-Request-Id": "client-id-2"},
            timeout=10,
        )
        assert echoed.status_code == 400 and echoed.headers["x-request-id"] == "client-id-2"


def test_engines_get_the_engine_api_key_and_never_the_clients(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("sk-client\n")
    (tmp_path / "engine-key").write_text("sk-engine\n")
    config = {
        "apiKeyFile": str(tmp_path / "keys"),
        "engineKeyFile": str(tmp_path / "engine-key"),
    }
    with _engine() as (url, seen), router([url], tmp_path, config=config) as front:
        answer = httpx.post(
            front + "/v1/completions",
            json=FINE,
            headers={"Authorization": "Bearer sk-client"},
            timeout=10,
        )
        assert answer.status_code == 200
        assert seen[-1]["authorization"] == "Bearer sk-engine"
