"""The router's engine connections (`router/upstream.py`) against scripted
HTTP/1.1 servers on loopback: keep-alive reuse, bodies delivered as they
arrive, the ways an answer can end, and failures before and after the first
byte."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path

import httpx
import pytest

from shoal.router.relay import ChunkRelay
from shoal.router.upstream import Address, Exchange, Pool, UpstreamError, request_head
from tests.integration.procs import router

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's head and body, or None when the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


class Server:
    """Counts connections; each one runs `script`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Address:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.script(reader, writer)
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return Address.parse(f"http://127.0.0.1:{port}")

    async def __aexit__(self, *_: object) -> None:
        self.server.close()


async def _exchange(pool: Pool, address: Address, body: bytes = b"{}") -> Exchange:
    exchange = await pool.open(address)
    exchange.send(request_head(b"POST", b"/v1/completions", address, len(body)) + body)
    return exchange


def _ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(extra) + b"\r\n" + body


def test_an_address_keeps_port_tls_and_path_prefix() -> None:
    assert Address.parse("http://10.0.0.5:8000") == Address(
        "10.0.0.5", 8000, False, b"10.0.0.5:8000", b""
    )
    assert Address.parse("https://engine.example/base/") == Address(
        "engine.example", 443, True, b"engine.example", b"/base"
    )
    assert Address.parse("http://[fd00::5]:8000").host == "fd00::5"


def test_a_connection_is_kept_alive_and_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await _read_request(reader)) is not None:
            server.requests.append(request)
            writer.write(_ok(b'{"n": %d}' % len(server.requests)))

    server = Server(script)

    async def scenario() -> None:
        pool = Pool(connect_seconds=1)
        async with server as address:
            for n in (1, 2, 3):
                exchange = await _exchange(pool, address, b'{"q": %d}' % n)
                status, headers = await exchange.head
                await exchange.done
                assert (status, exchange.body()) == (200, b'{"n": %d}' % n)
                assert (b"Content-Length", b"8") in headers
                exchange.release()
        pool.close()

    asyncio.run(scenario())
    assert server.connections == 1
    assert server.requests[2].startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert server.requests[2].endswith(b'Content-Length: 8\r\n\r\n{"q": 3}')


def test_an_answer_that_says_close_or_is_not_read_whole_is_not_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader) is not None:
            writer.write(_ok(b"{}", b"Connection: close\r\n"))

    server = Server(script)

    async def scenario() -> None:
        pool = Pool(connect_seconds=1)
        async with server as address:
            for _ in range(2):
                exchange = await _exchange(pool, address)
                await exchange.done
                exchange.release()
            # Headers read, body not awaited: the connection cannot carry another.
            exchange = await _exchange(pool, address)
            await exchange.head
            exchange.release()
            exchange = await _exchange(pool, address)
            await exchange.done
            exchange.release()

    asyncio.run(scenario())
    assert server.connections == 4


def test_a_chunked_body_reaches_the_sink_as_each_piece_arrives() -> None:
    """No buffering: the first piece is delivered while the server still
    holds the second back."""
    release = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata 1\r\n")
        await release.wait()
        writer.write(b"6\r\ndata 2\r\n0\r\n\r\n")

    received: list[bytes] = []

    async def scenario() -> None:
        async with Server(script) as address:
            pool = Pool(connect_seconds=1)
            first = asyncio.Event()
            exchange = await pool.open(address)
            exchange.send(
                request_head(b"POST", b"/", address, 0), on_first=lambda _status: first.set()
            )
            await exchange.head

            def sink(chunk: bytes) -> None:
                received.append(chunk)

            exchange.attach(sink)
            # on_first fires in the read callback that feeds the sink too.
            await asyncio.wait_for(first.wait(), 5)
            assert received == [b"data 1"]
            release.set()
            await asyncio.wait_for(exchange.done, 5)
            exchange.release()

    asyncio.run(scenario())
    assert received == [b"data 1", b"data 2"]


def test_a_body_delimited_by_the_connection_end_and_an_interim_answer() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()

    async def scenario() -> tuple[int, bytes]:
        async with Server(script) as address:
            exchange = await _exchange(Pool(connect_seconds=1), address)
            status, _ = await exchange.head
            await asyncio.wait_for(exchange.done, 5)
            return status, exchange.body()

    assert asyncio.run(scenario()) == (200, b"all of it")


def test_a_body_delimited_by_the_connection_end_that_is_reset_is_not_complete() -> None:
    """Only the connection's clean end (FIN) ends such a body: a reset (RST),
    the engine's process killed say, cuts it short, and the client must not
    be handed a part as the whole."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\npart of")
        await writer.drain()
        await asyncio.sleep(0.2)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # closed with linger 0: a reset

    async def scenario() -> UpstreamError:
        async with Server(script) as address:
            exchange = await _exchange(Pool(connect_seconds=1), address)
            await exchange.head
            with pytest.raises(UpstreamError) as failure:
                await asyncio.wait_for(exchange.done, 5)
            return failure.value

    assert asyncio.run(scenario()).answered


def test_an_answer_is_held_within_its_own_limit_and_the_pools_budget() -> None:
    """`filled` comes with the whole answer when it fits, or once the answer
    outgrows its own limit or, with the others held, the pool's budget; the
    pool's count of held bytes goes back to zero however each ends."""
    sizes = {b"/big": 1500, b"/medium": 700}

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        assert request is not None
        size = sizes[request.split(b" ")[1]]
        # In pieces, one byte short: the answer never ends.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (size + 1))
        for _ in range(size // 100):
            writer.write(b"x" * 100)
            await writer.drain()
            await asyncio.sleep(0.01)
        await reader.read(1)  # until the client closes

    async def held(pool: Pool, address: Address, path: bytes) -> Exchange:
        exchange = await pool.open(address)
        exchange.send(request_head(b"GET", path, address, 0))
        await asyncio.wait_for(exchange.filled(), 5)
        return exchange

    async def scenario() -> None:
        pool = Pool(connect_seconds=1, hold_answer_bytes=1000, hold_total_bytes=1000)
        async with Server(script) as address:
            big = await held(pool, address, b"/big")  # past its own limit
            assert not big.done.done() and len(big.body()) == 1100
            big.release()
            assert pool.held_bytes == 0
            # Two answers that each fit their own limit, held together.
            one = await pool.open(address)
            one.send(request_head(b"GET", b"/medium", address, 0))
            filled = one.filled()
            await asyncio.sleep(0.3)  # all it sends came: it fits, but never ends
            assert pool.held_bytes == 700 and not filled.done()
            two = await held(pool, address, b"/medium")  # past the pool's budget
            assert not two.done.done() and 300 < len(two.body()) < 700
            assert two.take() and pool.held_bytes == 700
            one.release()
            two.release()
            assert pool.held_bytes == 0
        pool.close()

    asyncio.run(scenario())


def test_an_answer_head_without_end_fails_at_its_bound_not_its_deadline() -> None:
    """An engine (or whatever holds its address) sending header lines, or one
    header value, without end: the parser would keep them all until the
    first-byte deadline (120 s by default)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"a" * 65536)
                await writer.drain()

    async def scenario() -> UpstreamError:
        pool = Pool(connect_seconds=1)
        async with Server(script) as address:
            exchange = await _exchange(pool, address)
            with pytest.raises(UpstreamError) as failed:
                await asyncio.wait_for(exchange.head, 10)
            exchange.release()
        pool.close()
        return failed.value

    error = asyncio.run(scenario())
    assert "head" in str(error) and error.answered is False, error


@pytest.mark.parametrize(
    ("answer", "answered"),
    [
        (b"", False),  # closed with no answer: the engine died or dropped it
        (b"NOT HTTP AT ALL\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort", True),
    ],
    ids=["no answer", "garbage", "cut short"],
)
def test_failures_say_whether_the_answer_had_begun(answer: bytes, answered: bool) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def scenario() -> UpstreamError:
        async with Server(script) as address:
            exchange = await _exchange(Pool(connect_seconds=1), address)
            with pytest.raises(UpstreamError) as failure:
                await asyncio.wait_for(exchange.done, 5)
            return failure.value

    assert asyncio.run(scenario()).answered is answered


def test_a_refused_connection_is_an_upstream_error() -> None:
    async def scenario() -> None:
        async with Server(lambda r, w: asyncio.sleep(0)) as address:
            pass  # closed: nothing listens on the port any more
        with pytest.raises(UpstreamError) as failure:
            await Pool(connect_seconds=1).open(address)
        assert not failure.value.answered

    asyncio.run(scenario())


def test_an_idle_connection_the_engine_closed_leaves_the_pool() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok(b"{}"))
        await writer.drain()
        # Then close it while idle, as an engine's keep-alive timeout does.

    server = Server(script)

    async def scenario() -> None:
        pool = Pool(connect_seconds=1)
        async with server as address:
            first = await _exchange(pool, address)
            await first.done
            first.release()
            for _ in range(500):  # until the close reaches the router's side
                if first.transport is None:
                    break
                await asyncio.sleep(0.01)
            assert first.transport is None
            second = await _exchange(pool, address)
            assert second is not first and not second.reused
            await second.done

    asyncio.run(scenario())
    assert server.connections == 2


# ---- through the router process


def _dechunk(body: bytes) -> bytes:
    payload, at = bytearray(), 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if size == 0:
            return bytes(payload)
        payload += body[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


class _ThreadedEngine:
    """A raw HTTP/1.1 engine in a thread: `serve(conn, n, request)` answers the
    n-th request (from 1) of a connection, or returns False to drop it."""

    def __init__(self, serve: Callable[[socket.socket, int, bytes], bool]) -> None:
        self.serve = serve
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            n = 0
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                request = head + reader.read(int(length.group(1)) if length else 0)
                if request.startswith(b"GET /metrics"):
                    conn.sendall(_ok(b""))
                    continue
                n += 1
                if not self.serve(conn, n, request):
                    return

    def close(self) -> None:
        self.listener.close()


def _send_chunked(conn: socket.socket, pieces: Iterable[bytes], *, gap: float = 0.0) -> None:
    """An engine's streamed answer: each piece one HTTP/1.1 chunk."""
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for piece in pieces:
        conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        time.sleep(gap)
    conn.sendall(b"0\r\n\r\n")


def _streaming_engine(pieces: Iterable[bytes], *, gap: float = 0.0) -> _ThreadedEngine:
    def serve(conn: socket.socket, _: int, __: bytes) -> bool:
        _send_chunked(conn, pieces, gap=gap)
        return True

    return _ThreadedEngine(serve)


def _stream_request(front: str, version: bytes) -> socket.socket:
    """A streamed completion asked of the router over a raw socket."""
    body = b'{"model": "m", "prompt": "hi", "stream": true}'
    client = socket.create_connection(("127.0.0.1", int(front.rsplit(":", 1)[1])), timeout=10)
    client.sendall(
        b"POST /v1/completions HTTP/%s\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s"
        % (version, len(body), body)
    )
    return client


def test_a_kept_alive_connection_the_engine_dropped_is_not_a_failure(tmp_path: Path) -> None:
    """The engine closes an idle connection just as the router sends on it
    (uvicorn's keep-alive timeout racing a new request): the router sends again
    on a new connection; the client, the breaker and the metrics see nothing."""

    def serve(conn: socket.socket, n: int, _: bytes) -> bool:
        if n > 1:
            return False  # read the request, then drop the connection unanswered
        conn.sendall(_ok(b'{"choices": []}', b"Content-Type: application/json\r\n"))
        return True

    engine = _ThreadedEngine(serve)
    try:
        with router(
            [engine.url], tmp_path, config={"circuitBreaker": {"failureThreshold": 1}}
        ) as front:
            for _ in range(4):
                response = httpx.post(
                    front + "/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=10
                )
                assert response.status_code == 200, response.text
            metrics = httpx.get(front + "/metrics", timeout=5).text
    finally:
        engine.close()
    assert engine.connections >= 4  # one per request: each was dropped after one answer
    assert 'code="502"' not in metrics
    assert "shoal_router_retries_total{" not in metrics


def test_a_client_that_stops_reading_stops_the_engine_not_the_router_memory(
    tmp_path: Path,
) -> None:
    """Backpressure: with the client not reading, the router stops reading
    from the engine, whose writes then block; every byte still arrives once
    the client reads again."""
    piece = 64 * 1024
    pieces = 1024  # 64 MiB: more than every socket buffer on the way can hold
    sent = [0]

    def counted() -> Iterator[bytes]:
        for _ in range(pieces):
            yield b"x" * piece
            sent[0] += piece  # resumed once the piece was sent

    engine = _streaming_engine(counted())
    try:
        with (
            router([engine.url], tmp_path) as front,
            _stream_request(front, b"1.1") as client,
        ):
            time.sleep(3)  # not reading
            stalled_at = sent[0]
            answer = bytearray()
            while not answer.endswith(b"\r\n0\r\n\r\n"):
                chunk = client.recv(1 << 20)
                assert chunk, "the router closed the stream before its end"
                answer += chunk
            payload = _dechunk(bytes(answer.partition(b"\r\n\r\n")[2]))
    finally:
        engine.close()
    assert stalled_at < pieces * piece // 2, f"the engine sent {stalled_at} bytes unread"
    assert len(payload) == sent[0] == pieces * piece
    assert payload.count(b"x") == len(payload)


def test_a_connection_idle_past_its_time_is_closed_by_the_router() -> None:
    """Closed before the engine's own keep-alive timeout would race a send."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader) is not None:
            writer.write(_ok(b"{}"))

    server = Server(script)

    async def scenario() -> None:
        pool = Pool(connect_seconds=1, idle_seconds=0.1)
        async with server as address:
            first = await _exchange(pool, address)
            await first.done
            first.release()
            await asyncio.sleep(0.05)
            again = await _exchange(pool, address)  # within the idle time: reused
            assert again is first
            await again.done
            again.release()
            await asyncio.sleep(0.3)
            assert first.transport is None
            fresh = await _exchange(pool, address)
            assert fresh is not first
            await fresh.done

    asyncio.run(scenario())
    assert server.connections == 2


def test_bytes_on_an_idle_connection_are_not_taken_for_the_next_answer() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader) is not None:
            writer.write(_ok(b"{}"))
            await writer.drain()
            writer.write(_ok(b"stray", b"X-Unasked: 1\r\n"))

    async def scenario() -> tuple[bytes, bytes]:
        pool = Pool(connect_seconds=1)
        async with Server(script) as address:
            first = await _exchange(pool, address)
            await first.done
            await asyncio.sleep(0.1)  # the stray answer arrives, whole or in part
            first_body = first.body()
            first.release()
            second = await _exchange(pool, address)
            assert second is not first
            await second.done
            return first_body, second.body()

    assert asyncio.run(scenario()) == (b"{}", b"{}")


def test_a_plain_answer_cut_short_is_retried_elsewhere(tmp_path: Path) -> None:
    """Nothing of a non-streamed answer reaches the client before its end, so
    an engine that dies halfway costs a retry on another replica, not the
    request; the failure still counts against that engine."""

    def cut(conn: socket.socket, _: int, __: bytes) -> bool:
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choi')
        return False

    def whole(conn: socket.socket, _: int, __: bytes) -> bool:
        conn.sendall(_ok(b'{"choices": []}', b"Content-Type: application/json\r\n"))
        return True

    broken, good = _ThreadedEngine(cut), _ThreadedEngine(whole)
    config = {"policy": "round-robin"}
    try:
        with router([broken.url, good.url], tmp_path, config=config) as front:
            for _ in range(4):
                response = httpx.post(
                    front + "/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=10
                )
                assert response.status_code == 200, response.text
                assert response.json() == {"choices": []}
            metrics = httpx.get(front + "/metrics", timeout=5).text
    finally:
        broken.close()
        good.close()
    assert 'shoal_router_retries_total{reason="broken_answer"}' in metrics, metrics
    cut_name = broken.url.removeprefix("http://")
    assert f'shoal_router_requests_total{{code="502",replica="{cut_name}"}}' in metrics


def test_an_http_1_0_client_gets_the_stream_unframed_to_the_connection_end(
    tmp_path: Path,
) -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(3)] + [b"data: [DONE]\n\n"]

    engine = _streaming_engine(events, gap=0.02)
    try:
        with (
            router([engine.url], tmp_path) as front,
            _stream_request(front, b"1.0") as client,
        ):
            answer = b""
            while chunk := client.recv(65536):  # until the router closes
                answer += chunk
    finally:
        engine.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding" not in head.lower()
    assert payload == b"".join(events)


class _UnreadClient:
    """A client transport that takes every write and never drains."""

    def __init__(self) -> None:
        self.written = 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 16 * 1024, 64 * 1024

    def get_write_buffer_size(self) -> int:
        return self.written

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False


async def _never() -> None:
    await asyncio.Event().wait()


def test_a_stream_that_ends_while_its_client_is_slow_leaves_the_connection_reading() -> None:
    # The relay pauses reading from the engine when the client's buffer is
    # full; the stream's end came in the same read, so the exchange went
    # back to the pool still paused, and the next request on it waited on
    # the slow client of the one before.
    stream = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in [b"x" * 100_000, b"[DONE]"])
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + stream + b"0\r\n\r\n"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await _read_request(reader)
        writer.write(_ok(b'{"next": true}'))

    server = Server(script)

    async def scenario() -> None:
        pool = Pool(connect_seconds=1)
        async with server as address:
            first = await _exchange(pool, address)
            await first.head
            loop = asyncio.get_running_loop()
            relay = ChunkRelay(
                _UnreadClient(),  # type: ignore[arg-type]
                first,
                _never,  # the client never drains
                chunked=True,
                stall_seconds=5,
                first_chunk_by=loop.time() + 5,
                deadline=loop.time() + 5,
            )
            first.attach(relay)
            await first.done
            relay.stop()
            first.release()
            second = await _exchange(pool, address)
            assert second is first, "not reused: test is void"
            status, _ = await asyncio.wait_for(second.head, 2)
            await second.done
            assert (status, second.body()) == (200, b'{"next": true}')
            second.release()
        pool.close()

    asyncio.run(scenario())
