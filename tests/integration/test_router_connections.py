"""Client connections at the router process, below its routes:

- a client that trickles its request headers in (slowloris) gets 408 within
  the header deadline and its connection is closed; so does one that sends
  nothing; on the internal port (peers, warm-up) too;
- connections beyond maxClientConnections are answered 503 (OpenAI-shaped,
  Retry-After) and closed; the router serves again once some close;
- with the client port full, the internal port (--serve-internal, as the
  operator runs routers) still answers /health, /ready and /metrics: kubelet's
  probes and the operator's reads go there;
- requests aiohttp's parser refuses get OpenAI-shaped 400s that echo none of
  their bytes, cheaply, with no traceback logged, and the router keeps serving;
- answers name no server software and, unless replicaHeader is set for
  debugging, no replica;
- a client that sends `Expect: 100-continue` and waits for it before its
  body (curl does for a body over 1 KiB) is told to go on at once; another
  expectation is refused with an OpenAI-shaped 417.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from shoal.procs import free_port
from shoal.router.metrics import INFLIGHT, read_samples
from tests.integration.procs import MODEL, router, sims

FINE = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def _address(front: str) -> tuple[str, int]:
    host, port = front.removeprefix("http://").split(":")
    return host, int(port)


@contextmanager
def _connection(front: str) -> Iterator[socket.socket]:
    with socket.create_connection(_address(front), timeout=10) as sock:
        yield sock


def _answer(sock: socket.socket) -> bytes:
    """Everything until the router closes the connection (bounded by the
    socket's timeout)."""
    answer = b""
    while True:
        try:
            got = sock.recv(65536)
        except TimeoutError:
            break
        if not got:
            break
        answer += got
    return answer


def _openai(answer: bytes, status: int) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    # HTTP/1.0 from the parser's errors: aiohttp answers a request it could not read so.
    assert head.startswith(b"HTTP/1.") and head[9:12] == b"%d" % status, answer[:300]
    assert b"server:" not in head.lower(), head
    error = json.loads(body)["error"]
    assert error["code"] == status and error["message"], error
    return dict(error)


def test_a_client_that_trickles_its_headers_gets_408_within_the_header_deadline(
    tmp_path: Path,
) -> None:
    config = {"timeouts": {"clientHeaderSeconds": 1}}
    with sims(1, tmp_path) as urls, router(urls, tmp_path, config=config) as front:
        with _connection(front) as slow, _connection(front) as silent:
            slow.settimeout(6)
            silent.settimeout(6)
            started = time.monotonic()
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            for _ in range(4):  # a header byte every half second: never done
                time.sleep(0.5)
                try:
                    slow.sendall(b"X")
                except OSError:
                    break
            _openai(_answer(slow), 408)
            _openai(_answer(silent), 408)
            assert time.monotonic() - started < 5
        # A request whose headers came in time is not cut by the deadline.
        with _connection(front) as ok:
            ok.settimeout(10)
            body = json.dumps({**FINE, "max_tokens": 30}).encode()
            ok.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert _answer(ok).startswith(b"HTTP/1.1 200")


def test_the_internal_port_has_the_same_header_deadline_and_error_answers(
    tmp_path: Path,
) -> None:
    internal = free_port()
    config = {
        "timeouts": {"clientHeaderSeconds": 1},
        "hotPrefixes": {"enabled": True},
        "internalPort": internal,
    }
    with sims(1, tmp_path) as urls, router(urls, tmp_path, config=config):
        inside = f"http://127.0.0.1:{internal}"
        with _connection(inside) as slow:
            slow.settimeout(6)
            started = time.monotonic()
            slow.sendall(b"GET /hot-prefixes HTTP/1.1\r\nHost: x\r\n")
            _openai(_answer(slow), 408)
            assert time.monotonic() - started < 5
        missing = httpx.get(inside + "/nowhere", timeout=5)
        assert missing.status_code == 404 and "server" not in missing.headers
        assert missing.json()["error"]["code"] == 404
        assert httpx.get(inside + "/hot-prefixes", timeout=5).json() == {"prefixes": []}


def test_connections_beyond_the_bound_are_refused_with_503_and_the_router_recovers(
    tmp_path: Path,
) -> None:
    config = {"maxClientConnections": 4}
    with sims(1, tmp_path) as urls, router(urls, tmp_path, config=config) as front:
        with ExitStack() as held:
            for _ in range(4):
                held.enter_context(_connection(front))
            time.sleep(0.2)  # the router has accepted them
            with _connection(front) as extra:
                extra.settimeout(5)
                answer = _answer(extra)
            _openai(answer, 503)
            assert b"retry-after: 1" in answer.lower()
        time.sleep(0.2)  # the held ones are closed at the router too
        assert httpx.post(front + "/v1/completions", json=FINE, timeout=10).status_code == 200


MALFORMED = [
    b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n",  # a method with a control byte
    b"GET /<script>\x00 HTTP/1.1\r\nHost: x\r\n\r\n",  # a NUL in the target
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Long: " + b"A" * 20_000 + b"\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Name<script>: 1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",  # smuggling
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
    b"HELLO<script>\r\n\r\n",
]


def test_requests_the_parser_refuses_get_openai_400s_that_echo_nothing(tmp_path: Path) -> None:
    with sims(1, tmp_path) as urls, router(urls, tmp_path) as front:
        started = time.monotonic()
        for raw in MALFORMED:
            with _connection(front) as sock:
                sock.sendall(raw)
                answer = _answer(sock)
            error = _openai(answer, 400)
            text = json.dumps(error)
            assert "script" not in text and "AAAA" not in text and "ZZ" not in text, text
        assert time.monotonic() - started < 10
        assert httpx.post(front + "/v1/completions", json=FINE, timeout=10).status_code == 200
    log = (tmp_path / "router.log").read_text()
    assert "Traceback" not in log and "Error handling request" not in log, log


def test_answers_name_no_server_software_and_no_replica_unless_asked(tmp_path: Path) -> None:
    with sims(1, tmp_path) as urls:
        with router(urls, tmp_path, config={"replicaHeader": False}) as front:
            answers = [
                httpx.post(front + "/v1/completions", json=FINE, timeout=10),
                httpx.post(front + "/v1/completions", json={**FINE, "stream": True}, timeout=10),
                httpx.post(front + "/v1/completions", content=b"{", timeout=10),
                httpx.get(front + "/nowhere", timeout=10),
                httpx.get(front + "/health", timeout=10),
                httpx.get(front + "/metrics", timeout=10),
            ]
            for answer in answers:
                assert "server" not in answer.headers, answer.headers
                assert "x-shoal-replica" not in answer.headers, answer.headers
            assert [a.status_code for a in answers] == [200, 200, 400, 404, 200, 200]
        with router(urls, tmp_path, config={"replicaHeader": True}, name="debug") as front:
            for body in (FINE, {**FINE, "stream": True}):
                answer = httpx.post(front + "/v1/completions", json=body, timeout=10)
                assert answer.headers["x-shoal-replica"] == urls[0].removeprefix("http://")


def test_a_client_that_expects_100_continue_is_told_to_go_on(tmp_path: Path) -> None:
    body = json.dumps(FINE).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nExpect: %s\r\nConnection: close\r\n\r\n"
    )
    with sims(1, tmp_path) as urls, router(urls, tmp_path) as front:
        with _connection(front) as sock:
            sock.settimeout(5)
            sock.sendall(head % (len(body), b"100-continue"))
            # Nothing more is sent until the router says to go on.
            assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(body)
            answer = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["choices"]
        with _connection(front) as sock:
            sock.sendall(head % (len(body), b"a-miracle") + body)
            error = _openai(_answer(sock), 417)
        assert error["param"] == "Expect"


def test_with_every_client_connection_held_the_internal_port_answers_probes_and_metrics(
    tmp_path: Path,
) -> None:
    # Kept-alive client pools fill the client port's bound with no load at all:
    # kubelet's liveness probe there got 503 and restarted a router that served
    # every one of those clients.
    internal = free_port()
    config = {"maxClientConnections": 3, "internalPort": internal}
    args = ["--serve-internal"]
    with (
        sims(1, tmp_path) as urls,
        router(urls, tmp_path, config=config, args=args) as front,
        ExitStack() as held,
    ):
        for _ in range(3):
            pooled = held.enter_context(_connection(front))
            pooled.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert pooled.recv(65536).startswith(b"HTTP/1.1 200"), "kept alive, then idle"
        with _connection(front) as probe:  # answered at once, before it asks
            _openai(_answer(probe), 503)
        inside = f"http://127.0.0.1:{internal}"
        assert httpx.get(inside + "/health", timeout=5).text == "ok"
        assert httpx.get(inside + "/ready", timeout=5).status_code == 200
        metrics = httpx.get(inside + "/metrics", timeout=5)
        assert metrics.status_code == 200 and INFLIGHT in metrics.text
        # What a full port looks like on a dashboard or in an alert.
        seen = {
            (sample.name, sample.labels.get("port")): sample.value
            for sample in read_samples(metrics.text)
        }
        assert seen[("shoal_router_client_connections", "api")] == 3
        assert seen[("shoal_router_connections_refused_total", "api")] == 1
        assert seen[("shoal_router_connections_refused_total", "internal")] == 0
