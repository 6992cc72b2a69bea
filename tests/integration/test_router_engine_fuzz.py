"""Generated broken answers from an engine (hypothesis, bounded in examples):
status lines, header sections, framings and bodies as a broken engine, or
whatever else came to its address, might write them, cut anywhere. The
router never fails itself on them: each request gets, within its deadlines,
either the engine's own answer relayed or the router's OpenAI-shaped error;
no traceback is logged, and the router serves a sound engine afterwards."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.procs import MODEL, router

# Short deadlines, and a breaker that never opens, so every example reaches
# the engine and none waits long.
CONFIG = {
    "retries": 0,
    "circuitBreaker": {"failureThreshold": 1000},
    "timeouts": {"connectSeconds": 1, "firstByteSeconds": 2, "totalSeconds": 3, "stallSeconds": 2},
}
ANSWER_SECONDS = 8.0  # past the router's deadlines, with room for a loaded machine

STATUS_LINES = st.one_of(
    st.sampled_from([0, 99, 200, 201, 204, 400, 404, 429, 500, 502, 503, 599, 600, 999]).map(
        lambda code: b"HTTP/1.1 %d Something\r\n" % code
    ),
    st.sampled_from([b"HTTP/1.0 200 OK\r\n", b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/2 200\r\n"]),
    st.binary(max_size=40).map(lambda b: b + b"\r\n"),
)
HEADER_LINES = st.lists(
    st.one_of(
        st.integers(-5, 1 << 40).map(lambda n: b"Content-Length: %d\r\n" % n),
        st.sampled_from(
            [
                b"Transfer-Encoding: chunked\r\n",
                b"Transfer-Encoding: gzip, chunked\r\n",
                b"Connection: close\r\n",
                b"Connection: keep-alive, Upgrade\r\n",
                b"Content-Type: text/event-stream\r\n",
                b"Content-Length: 5\r\nContent-Length: 7\r\n",
                b"X-Folded: a\r\n b\r\n",
                b"\r\n",
            ]
        ),
        st.binary(max_size=60).map(lambda b: b.replace(b"\r\n", b"") + b"\r\n"),
    ),
    max_size=5,
)
BODIES = st.one_of(
    st.binary(max_size=300),
    st.just(b'{"id": "cmpl-1", "choices": [{"text": "hi"}]}'),
    st.lists(st.binary(max_size=40), max_size=4).map(
        lambda parts: b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    ),
    st.just(b"ffffffffffffffffff\r\nx\r\n"),
)


class _Engine:
    """Answers each connection's first request with `answer`, then closes it
    (or, holding, leaves it open until the router closes it)."""

    def __init__(self, *, hold: bool = False) -> None:
        self.answer = b""
        self.hold = hold
        self.completions = 0  # requests for a completion it answered
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    got = conn.recv(65536)
                    if not got:
                        return
                    request += got
                self.completions += request.startswith(b"POST /v1/completions ")
                conn.sendall(self.answer)
                if self.hold:
                    conn.settimeout(60)
                else:
                    conn.shutdown(socket.SHUT_WR)
                conn.recv(1)  # until the router closes its end
            except OSError:
                return


@contextmanager
def broken_engine(*, hold: bool = False) -> Iterator[_Engine]:
    engine = _Engine(hold=hold)
    try:
        yield engine
    finally:
        engine.listener.close()


def _status_of(answer: bytes) -> int | None:
    """The status code the engine wrote, when its status line is one."""
    parts = answer.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1].isdigit():
        return int(parts[1])
    return None


def test_generated_broken_engine_answers_never_fail_the_router(tmp_path: Path) -> None:
    with broken_engine() as engine, router([engine.url], tmp_path, config=CONFIG) as front:
        client = httpx.Client(base_url=front, timeout=ANSWER_SECONDS)

        @settings(
            max_examples=200,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(
            status=STATUS_LINES,
            headers=HEADER_LINES,
            body=BODIES,
            cut=st.none() | st.integers(0, 400),
            stream=st.booleans(),
        )
        def answered(
            status: bytes, headers: list[bytes], body: bytes, cut: int | None, stream: bool
        ) -> None:
            answer = status + b"".join(headers) + b"\r\n" + body
            engine.answer = answer if cut is None else answer[:cut]
            request = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "stream": stream}
            started = time.monotonic()
            try:
                got = client.post("/v1/completions", json=request)
                status_code, content = got.status_code, got.content
            except httpx.RemoteProtocolError:
                # An answer relayed as it came and broken off by the engine
                # reaches the client unfinished, as it should.
                status_code, content = 0, b""
            assert time.monotonic() - started < ANSWER_SECONDS
            assert b"The router failed" not in content, content
            # HTTP status codes run from 100 to 599 (RFC 9110): a 999 relayed
            # is no answer a client can read as one.
            assert status_code == 0 or 200 <= status_code <= 599, status_code
            engines = _status_of(engine.answer)
            if status_code >= 500 and status_code != engines:
                # Not the engine's own: the router's, OpenAI-shaped.
                error = json.loads(content)["error"]
                assert error["code"] == status_code and error["message"], error

        answered()
        assert engine.completions >= 150  # the examples reached the engine
        # Still serving: the same router, the engine sound again.
        sound = b'{"id": "cmpl-1", "choices": [{"text": "hi"}]}'
        engine.answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(sound), sound)
        fine = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
        again = client.post("/v1/completions", json=fine)
        assert (again.status_code, again.content) == (200, sound)
        client.close()
    log = (tmp_path / "router.log").read_text()
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]


def test_a_status_under_100_is_a_malformed_answer_not_an_interim_one(tmp_path: Path) -> None:
    # An engine that keeps its connection open after a status under 100: read
    # as an interim answer, the router would wait for the real one until its
    # first-byte deadline (30 s here).
    patient = {
        **CONFIG,
        "timeouts": {"connectSeconds": 1, "firstByteSeconds": 30, "totalSeconds": 60},
    }
    with (
        broken_engine(hold=True) as engine,
        router([engine.url], tmp_path, config=patient) as front,
    ):
        engine.answer = b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n"
        started = time.monotonic()
        got = httpx.post(
            f"{front}/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
            timeout=60,
        )
        assert time.monotonic() - started < ANSWER_SECONDS
        assert got.status_code == 503, got.text
        assert "No replica could take the request" in json.loads(got.content)["error"]["message"]
