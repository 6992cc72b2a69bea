"""Hostile bodies and header sections, generated (hypothesis, bounded in
examples and time), against a router process: every answer is the engine's
200 or an OpenAI-shaped 4xx from the router, never a 5xx, each within a
bounded time, and the router still serves afterwards with no traceback
logged."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.procs import MODEL, router
from tests.integration.test_router_observed import recording_engine

FINE = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
# Each answer comes within this (the router refuses cheaply; the engine answers at once).
ANSWER_SECONDS = 5.0

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_bodies = st.one_of(
    st.binary(max_size=2048),
    _json.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(
        st.sampled_from(["model", "prompt", "messages", "stream", "max_tokens", "n", "user"]),
        _json,
        max_size=5,
    ).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda depth: b'{"model":"m","prompt":' + b"[" * depth),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
# Header lines as bytes on the wire: names and values with any byte but CR/LF.
_header_bytes = st.binary(min_size=0, max_size=64).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"")
)
_headers = st.lists(st.tuples(_header_bytes, _header_bytes), max_size=6)


def _check(status: int, body: bytes, head: bytes = b"") -> None:
    assert status < 500, (status, body[:200])
    if status != 200:
        assert 400 <= status < 500, status
        error = json.loads(body)["error"]
        assert error["code"] == status and isinstance(error["message"], str), error
    assert b"server:" not in head.lower()


def _raw_exchange(front: str, request: bytes) -> tuple[int, bytes, bytes]:
    host, port = front.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=ANSWER_SECONDS) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            got = sock.recv(65536)
            if not got:
                break
            answer += got
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 1 << 30  # until the connection closes


def test_generated_hostile_requests_get_openai_4xx_never_5xx(tmp_path: Path) -> None:
    with recording_engine() as (url, _), router([url], tmp_path) as front:
        client = httpx.Client(base_url=front, timeout=ANSWER_SECONDS)

        @settings(
            max_examples=120,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(body=_bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
        def bodies(body: bytes, path: str) -> None:
            started = time.monotonic()
            answer = client.post(path, content=body, headers={"Content-Type": "application/json"})
            assert time.monotonic() - started < ANSWER_SECONDS
            _check(answer.status_code, answer.content)

        @settings(max_examples=120, deadline=None, derandomize=True)
        @given(headers=_headers, method=st.sampled_from([b"POST", b"GET", b"PUT", b"P\x00ST"]))
        def header_sections(headers: list[tuple[bytes, bytes]], method: bytes) -> None:
            body = json.dumps(FINE).encode()
            lines = b"".join(b"%s: %s\r\n" % pair for pair in headers)
            request = (
                b"%s /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s"
                b"Connection: close\r\n\r\n%s" % (method, len(body), lines, body)
            )
            started = time.monotonic()
            status, head, answer = _raw_exchange(front, request)
            assert time.monotonic() - started < ANSWER_SECONDS
            _check(status, answer, head)

        bodies()
        header_sections()
        assert client.post("/v1/completions", json=FINE).status_code == 200
        client.close()
    log = (tmp_path / "router.log").read_text()
    assert "Traceback" not in log and "Error handling request" not in log, log[-2000:]
