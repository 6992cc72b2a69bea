"""Answers too large to hold: a client asking for a huge non-streamed answer
(logprobs for thousands of tokens, `n` of them, a batch of embeddings) must
not make the router hold it whole, or a few of them would run it out of
memory and lose every request it carries. Past what the router holds for a
retry, the answer is relayed as it comes; an engine that breaks off after
that cuts the client's answer short, visibly (an unfinished chunked body),
never as a well-formed one."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from shoal.procs import start_router
from shoal.router.upstream import HOLD_ANSWER_BYTES
from tests.integration.procs import MODEL, peak_rss_mib

MIB = 1 << 20


def _answer_bytes(size: int) -> bytes:
    """A JSON completion answer of exactly `size` bytes."""
    shell = json.dumps({"id": "cmpl-big", "model": MODEL, "choices": [{"text": ""}]})
    pad = size - len(shell)
    return shell.replace('"text": ""', '"text": "' + "x" * pad + '"').encode()


class _BigEngine(BaseHTTPRequestHandler):
    """Answers each completion with a body of `size` bytes (the request's
    `max_tokens` in MiB), written a MiB at a time; with `"cut": true` it
    closes the connection after three quarters of it."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # /metrics and the rest: nothing to read
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        body = _answer_bytes(int(request["max_tokens"]) * MIB)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        end = len(body) * 3 // 4 if request.get("cut") else len(body)
        view = memoryview(body)
        for start in range(0, end, MIB):
            self.wfile.write(view[start : min(start + MIB, end)])
        if request.get("cut"):
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _big_router(tmp: Path) -> Iterator[tuple[str, int]]:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _BigEngine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{engine.server_address[1]}"
        # One try: a retry would ask the same engine again.
        with start_router(
            log=tmp / "router.log", config={"retries": 0}, endpoints=[endpoint]
        ) as front:
            front.wait_http("/ready", timeout=20)
            yield front.url, front.pid
    finally:
        engine.shutdown()
        engine.server_close()


def _post(front: str, request: dict[str, object]) -> tuple[int, bytes]:
    digest = hashlib.sha256()
    size = 0
    with httpx.stream("POST", front + "/v1/completions", json=request, timeout=60) as answer:
        for chunk in answer.iter_bytes():
            digest.update(chunk)
            size += len(chunk)
        return answer.status_code, digest.digest() + size.to_bytes(8, "big")


def test_an_answer_larger_than_the_router_holds_reaches_the_client_whole_in_bounded_memory(
    tmp_path: Path,
) -> None:
    with _big_router(tmp_path) as (front, pid):
        small = _post(front, {"model": MODEL, "prompt": "hi", "max_tokens": 1})
        assert small[0] == 200
        before = peak_rss_mib(pid)
        size_mib = 160
        status, got = _post(front, {"model": MODEL, "prompt": "hi", "max_tokens": size_mib})
        want = _answer_bytes(size_mib * MIB)
        assert status == 200
        assert got == hashlib.sha256(want).digest() + len(want).to_bytes(8, "big")
        grown = peak_rss_mib(pid) - before
        # Held whole, the answer alone would be 160 MiB (320 while joined).
        assert grown < 2 * HOLD_ANSWER_BYTES / MIB + 24, f"router peak grew {grown:.0f} MiB"
        # The connection stays usable: the next answer comes as usual.
        assert _post(front, {"model": MODEL, "prompt": "hi", "max_tokens": 1})[0] == 200
    log = (tmp_path / "router.log").read_text()
    assert "Traceback" not in log, log


def test_an_engine_that_breaks_off_a_relayed_answer_cuts_the_clients_answer_visibly(
    tmp_path: Path,
) -> None:
    with _big_router(tmp_path) as (front, _):
        request = {"model": MODEL, "prompt": "hi", "max_tokens": 32, "cut": True}
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", front + "/v1/completions", json=request, timeout=60) as answer,
        ):
            assert answer.status_code == 200
            for _ in answer.iter_bytes():
                pass
        assert _post(front, {"model": MODEL, "prompt": "hi", "max_tokens": 1})[0] == 200
    log = (tmp_path / "router.log").read_text()
    assert "broke after its first byte" in log and "Traceback" not in log, log


def _post_http10(front: str, request: dict[str, object]) -> tuple[bytes, int]:
    """An HTTP/1.0 POST (as nginx proxies by default): the answer's head, and
    how many body bytes came before the router closed the connection."""
    host, port = front.removeprefix("http://").split(":")
    body = json.dumps(request).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        got = bytearray()
        while chunk := sock.recv(MIB):
            got += chunk
    head, _, rest = bytes(got).partition(b"\r\n\r\n")
    return head, len(rest)


def _length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None


def test_an_http10_client_can_tell_a_relayed_answer_cut_short_from_a_whole_one(
    tmp_path: Path,
) -> None:
    # An HTTP/1.0 client's body ends where the connection does: without the
    # engine's Content-Length, an answer the engine broke off read as whole
    # (a proxy such as nginx passed it on as a complete 200).
    with _big_router(tmp_path) as (front, _):
        request: dict[str, object] = {"model": MODEL, "prompt": "hi", "max_tokens": 32}
        head, size = _post_http10(front, request)
        assert head.startswith(b"HTTP/1.1 200") and _length(head) == size == 32 * MIB, head
        head, size = _post_http10(front, {**request, "cut": True})
        assert head.startswith(b"HTTP/1.1 200") and _length(head) == 32 * MIB, head
        assert size < 32 * MIB
