"""The router's own HTTP/1.1 server (router/connections.py), over raw
loopback sockets, for what aiohttp's server did for the router before it and
the contract tests elsewhere take for granted:

- kept-alive and pipelined requests are answered, in order, on one connection;
- requests pipelined before a malformed one are answered, then the 400;
- HTTP/1.0 and `Connection: close` end the connection after the answer;
- HEAD gets the head and the length, no body;
- a chunked body is read whole; one past the bound is a 413 (its bytes
  read past and dropped, so the connection serves on);
- a body answered before it came is read and dropped, and the connection
  serves on; one past the bound, or one that stops coming, closes it;
- an upgrade (h2c) is answered as HTTP/1.1, then the connection closes;
- an absolute-form target is served by its path;
- an idle kept-alive connection is closed;
- shutting down closes idle connections at once and lets answers under way
  finish first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from shoal.router import connections
from shoal.router.app import Discovery, Router
from shoal.router.config import RouterConfig
from shoal.router.connections import HttpServer
from shoal.router.incoming import Answer, Incoming
from tests.router_served import RouterTestServer

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def _router(config: dict[str, object] | None = None) -> AsyncIterator[int]:
    """A router with no replica routable; its port."""
    router = Router(
        RouterConfig.model_validate(config or {}), Discovery(endpoints=["http://127.0.0.1:9"])
    )
    await router.proxy.start()
    try:
        async with RouterTestServer(router) as served:
            assert served.port is not None
            yield served.port
    finally:
        await router.proxy.close()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lowercased names), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 5) if length else b""
    return status, headers, body


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the router closed the connection, with nothing more sent."""
    return await asyncio.wait_for(reader.read(65536), 5) == b""


def test_kept_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async def slow_first(request: Incoming) -> Answer:
        if request.path == "/slow":
            await asyncio.sleep(0.2)
        return web.Response(text=request.path)

    async def run() -> list[tuple[int, bytes]]:
        served = HttpServer(slow_first, header_seconds=5, max_connections=10, client_max_size=1024)
        listener = await asyncio.get_running_loop().create_server(served, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        get = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n"
        writer.write(get % b"/slow" + get % b"/fast" + get % b"/slow" + get % b"/fast")
        answers = [(await _answer(reader))[::2] for _ in range(4)]
        writer.write(get % b"/later")  # the same connection, later
        answers.append((await _answer(reader))[::2])
        writer.close()
        listener.close()
        await served.shutdown(1)
        return answers

    assert asyncio.run(run()) == [
        (200, b"/slow"),
        (200, b"/fast"),
        (200, b"/slow"),
        (200, b"/fast"),
        (200, b"/later"),
    ]


def test_requests_pipelined_before_a_malformed_one_are_answered_then_the_400() -> None:
    async def run() -> tuple[list[int], dict[str, str], bool]:
        async with _router() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(get + get + b"G\x01T / HTTP/1.1\r\n\r\n")
            answers = [await _answer(reader) for _ in range(3)]
            closed = await _closed(reader)
            writer.close()
        return [a[0] for a in answers], answers[1][1], closed

    statuses, second, closed = asyncio.run(run())
    assert statuses == [200, 200, 400] and closed
    assert second.get("connection") == "close"  # the last answer it gets says so


def test_http10_and_connection_close_end_the_connection_after_the_answer() -> None:
    async def run() -> list[tuple[int, str, bool]]:
        results = []
        async with _router() as port:
            for request in (
                b"GET /health HTTP/1.0\r\n\r\n",
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            ):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                status, headers, _ = await _answer(reader)
                results.append((status, headers.get("connection", ""), await _closed(reader)))
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
            for _ in range(2):
                status, headers, _ = await _answer(reader)
                results.append((status, headers.get("connection", ""), False))
            writer.close()
        return results

    assert asyncio.run(run()) == [
        (200, "close", True),
        (200, "close", True),
        (200, "keep-alive", False),
        (200, "keep-alive", False),
    ]


def test_head_gets_the_head_and_the_length_without_the_body() -> None:
    async def run() -> tuple[int, dict[str, str], int]:
        async with _router() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = await _answer(reader)  # the next answer: no body came between
            writer.close()
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        return int(lines[0].split()[1]), headers, status if body == b"ok" else -1

    status, headers, next_status = asyncio.run(run())
    assert status == 200 and headers["content-length"] == "2"
    assert next_status == 200


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_a_chunked_body_is_read_whole_and_one_past_the_bound_is_413() -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    small = json.dumps({"model": "m", "prompt": "hi " * 100}).encode()
    large = json.dumps({"model": "m", "prompt": "hi " * 500}).encode()
    assert len(small) < 1024 < len(large)

    async def run() -> tuple[int, str, int, int]:
        async with _router({"maxRequestSize": "1Ki"}) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head + _chunked(small, 100))
            # Read whole and valid: no replica is there to take it.
            status, _, answer = await _answer(reader)
            message = json.loads(answer)["error"]["message"]
            writer.write(head + _chunked(large, 100))
            too_large, _, _ = await _answer(reader)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            after, _, _ = await _answer(reader)
            writer.close()
        return status, message, too_large, after

    status, message, too_large, after = asyncio.run(run())
    assert status == 503 and "No replica" in message, message
    assert (too_large, after) == (413, 200)


async def _answered_then_closed(raw: bytes) -> tuple[int, bool]:
    """Send `raw` to a router: the answer's status, and whether the router
    then closed the connection."""
    async with _router() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        status, _, _ = await _answer(reader)
        closed = await _closed(reader)
        writer.close()
    return status, closed


def test_a_body_answered_before_it_came_is_dropped_and_the_connection_serves_on() -> None:
    """As nginx discards it: one reconnect fewer for a client refused early
    (a 401, a 404); the dropped body is never taken for a request."""
    smuggled = b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
    head = b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled)

    async def run() -> list[int]:
        async with _router() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            statuses = [(await _answer(reader))[0]]
            writer.write(smuggled + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            statuses.append((await _answer(reader))[0])
            writer.close()
        return statuses

    assert asyncio.run(run()) == [404, 200]  # no 404 for the smuggled GET


def test_a_body_past_the_bound_or_stalled_after_an_early_answer_closes_the_connection() -> None:
    config: dict[str, object] = {"maxRequestSize": "1Ki", "timeouts": {"clientHeaderSeconds": 1}}

    async def run() -> list[tuple[int, bool]]:
        results = []
        async with _router(config) as port:
            for length, sent in ((5000, b""), (500, b"x" * 100)):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(
                    b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                    % (length, sent)
                )
                status, _, _ = await _answer(reader)
                results.append((status, await _closed(reader)))
                writer.close()
        return results

    # Past the bound: closed at once; the rest of a short one never came:
    # closed after the header deadline.
    assert asyncio.run(run()) == [(404, True), (404, True)]


def test_an_upgrade_is_answered_as_http11_and_the_connection_closed() -> None:
    raw = (
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
    )
    assert asyncio.run(_answered_then_closed(raw)) == (200, True)


def test_an_absolute_form_target_is_served_by_its_path() -> None:
    async def run() -> int:
        async with _router() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET http://example.com/health HTTP/1.1\r\nHost: example.com\r\n\r\n")
            status, _, _ = await _answer(reader)
            writer.close()
        return status

    assert asyncio.run(run()) == 200


def test_an_idle_kept_alive_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "KEEPALIVE_SECONDS", 0.3)

    async def run() -> tuple[int, bool, float]:
        async with _router() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, _ = await _answer(reader)
            started = asyncio.get_running_loop().time()
            closed = await _closed(reader)
            writer.close()
        return status, closed, asyncio.get_running_loop().time() - started

    status, closed, waited = asyncio.run(run())
    assert status == 200 and closed and waited < 2, waited


def test_shutdown_closes_idle_connections_and_lets_answers_under_way_finish() -> None:
    release = asyncio.Event()

    async def slow(request: Incoming) -> Answer:
        if request.path == "/slow":
            await release.wait()
        return web.Response(text="done")

    async def run() -> tuple[bool, int, bytes, bool]:
        served = HttpServer(slow, header_seconds=5, max_connections=10, client_max_size=1024)
        listener = await asyncio.get_running_loop().create_server(served, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        idle_writer.write(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
        await _answer(idle_reader)
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
        busy_writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.1)
        listener.close()
        shutdown = asyncio.create_task(served.shutdown(5))
        idle_closed = await _closed(idle_reader)
        release.set()
        status, _, body = await _answer(busy_reader)
        busy_closed = await _closed(busy_reader)
        await shutdown
        idle_writer.close()
        busy_writer.close()
        return idle_closed, status, body, busy_closed

    assert asyncio.run(run()) == (True, 200, b"done", True)
