"""The router's HTTP/1.1 server (router/connections.py) under generated
framing: pipelined requests, bodies sized by Content-Length or sent as chunks
of any size, some with trailers, all cut into TCP writes at generated places.
However the bytes are cut, every request reaches the handler whole and in
order, each answer (plain, or streamed in chunks over several writes)
matches its request, and the connection serves on.

test_router_http.py checks each framing rule by hand; this searches their
combinations: a body cut inside a chunk-size line, a request ended by the
write that starts the next, and more pipelined requests than the server
queues before it pauses reading (the hand-written tests pipeline four, too
few to pause it: a server that never resumed passed them, and fails this)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from shoal.router import connections
from shoal.router.connections import HttpServer
from shoal.router.incoming import Answer, Handler, Incoming, Streamed

MAX_BODY = 4096
Connected = tuple[HttpServer, asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(frozen=True)
class Sent:
    method: bytes
    path: bytes
    body: bytes
    chunks: tuple[int, ...] | None  # chunk sizes, or None for Content-Length
    trailer: bool

    def wire(self) -> bytes:
        head = b"%s %s HTTP/1.1\r\nHost: x\r\n" % (self.method, self.path)
        if self.chunks is None:
            if self.method == b"GET" and not self.body:
                return head + b"\r\n"
            return head + b"Content-Length: %d\r\n\r\n%s" % (len(self.body), self.body)
        out, at = [head + b"Transfer-Encoding: chunked\r\n\r\n"], 0
        for size in self.chunks:
            out.append(b"%x\r\n%s\r\n" % (size, self.body[at : at + size]))
            at += size
        out.append(b"0\r\n" + (b"X-Sum: 1\r\n" if self.trailer else b"") + b"\r\n")
        return b"".join(out)

    def expected(self) -> bytes:
        return b"%s %s %d %s" % (
            self.method,
            self.path,
            len(self.body),
            hashlib.sha256(self.body).hexdigest().encode(),
        )


def _split(total: int, cuts: list[int]) -> tuple[int, ...]:
    """`total` bytes as chunk sizes, cut at the given offsets (each chunk at
    least one byte: a zero-size chunk ends the body)."""
    points = sorted({c for c in cuts if 0 < c < total})
    edges = [0, *points, total]
    return tuple(b - a for a, b in itertools.pairwise(edges) if b > a)


@st.composite
def _requests(draw: st.DrawFn) -> Sent:
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT"]))
    path = b"/%s%d" % (draw(st.sampled_from([b"p", b"s"])), draw(st.integers(0, 999)))
    body = b"" if method == b"GET" else draw(st.binary(max_size=MAX_BODY))
    chunked = method != b"GET" and draw(st.booleans())
    chunks = None
    if chunked:
        chunks = _split(len(body), draw(st.lists(st.integers(0, len(body)), max_size=8)))
    return Sent(method, path, body, chunks, chunked and draw(st.booleans()))


async def _echo(request: Incoming) -> Answer:
    """The request as received; to paths under /s, streamed in three writes."""
    body = await request.read()
    text = b"%s %s %d %s" % (
        request.method.encode(),
        request.path.encode(),
        len(body),
        hashlib.sha256(body).hexdigest().encode(),
    )
    if not request.path.startswith("/s"):
        return web.Response(body=text)
    third = len(text) // 3
    request.stream_head(200, CIMultiDict(), text[:third])
    await asyncio.sleep(0)
    request.stream_write(text[third : 2 * third])
    await request.drain()
    request.stream_write(text[2 * third :])
    return Streamed(200)  # the server writes the last chunk


async def _slow_echo(request: Incoming) -> Answer:
    await asyncio.sleep(0.002)  # so requests queue while the bytes come
    return await _echo(request)


@asynccontextmanager
async def _connected(handler: Handler) -> AsyncIterator[Connected]:
    """A server for `handler` on a loopback port, and a client connected to it."""
    served = HttpServer(handler, header_seconds=5, max_connections=4, client_max_size=MAX_BODY)
    listener = await asyncio.get_running_loop().create_server(served, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield served, reader, writer
    finally:
        writer.close()
        listener.close()
        await served.shutdown(1)


async def _answers(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 "), head
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
        if fields.get(b"transfer-encoding") == b"chunked":
            body = b""
            while size := int(await asyncio.wait_for(reader.readuntil(b"\r\n"), 5), 16):
                body += (await reader.readexactly(size + 2))[:-2]
            assert await reader.readexactly(2) == b"\r\n"
        else:
            body = await asyncio.wait_for(reader.readexactly(int(fields[b"content-length"])), 5)
        bodies.append(body)
    return bodies


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    sent=st.lists(_requests(), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 1 << 16), max_size=12),
)
def test_any_cut_of_pipelined_framed_requests_is_answered_whole_and_in_order(
    sent: list[Sent], cuts: list[int]
) -> None:
    stream = b"".join(r.wire() for r in sent)
    writes = _split(len(stream), [c % (len(stream) + 1) for c in cuts])

    async def run() -> list[bytes]:
        async with _connected(_slow_echo) as (_, reader, writer):
            at = 0
            for size in writes:
                writer.write(stream[at : at + size])
                at += size
                await writer.drain()
                await asyncio.sleep(0)  # let the server read this write alone
            answers = await _answers(reader, len(sent))
            # The connection serves on after all of it.
            writer.write(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
            return answers + await _answers(reader, 1)

    expected = [r.expected() for r in sent] + [Sent(b"GET", b"/after", b"", None, False).expected()]
    assert asyncio.run(run()) == expected


@settings(max_examples=100, deadline=None, derandomize=True)
@given(sent=st.lists(_requests(), min_size=1, max_size=6), cut=st.integers(0, 1 << 16))
def test_a_client_gone_at_any_byte_leaves_no_request_running(sent: list[Sent], cut: int) -> None:
    """The client sends its pipelined requests up to a generated byte and
    drops the connection, while the handler waits for the rest of a body or
    for an engine that has not answered: the handler is cancelled (and the
    engine's request with it), and the connection leaves the server's count,
    so it holds no slot of the connection bound."""
    stream = b"".join(r.wire() for r in sent)
    stream = stream[: cut % (len(stream) + 1)]
    running: set[asyncio.Task[object] | None] = set()

    async def engine_thinking(request: Incoming) -> Answer:
        task = asyncio.current_task()
        running.add(task)
        try:
            await request.read()
            await asyncio.sleep(60)  # an engine still on it
            return web.Response()
        finally:
            running.discard(task)

    async def run() -> tuple[int, int, int]:
        async with _connected(engine_thinking) as (served, _, writer):
            writer.write(stream)
            await writer.drain()
            for _ in range(20):  # the server has read it all
                await asyncio.sleep(0)
            started = len(running)
            writer.transport.abort()
            for _ in range(200):  # the server sees the reset within a few loop turns
                if not served.connections and not running:
                    break
                await asyncio.sleep(0.005)
            return started, len(served.connections), len(running)

    started, connections, handlers = asyncio.run(run())
    assert (connections, handlers) == (0, 0), started


def test_pipelined_requests_past_what_the_server_holds_are_all_answered() -> None:
    """More pipelined bytes than the server holds unparsed: it stops reading
    once it holds too much, and reads again as answers go out."""
    sent = [Sent(b"POST", b"/p%d" % i, bytes([i]) * 3000, None, False) for i in range(60)]
    stream = b"".join(r.wire() for r in sent)
    assert len(stream) > 2 * connections._HELD_BYTES

    async def run() -> list[bytes]:
        async with _connected(_slow_echo) as (_, reader, writer):
            for at in range(0, len(stream), 4096):  # read by the server write by write
                writer.write(stream[at : at + 4096])
                await asyncio.sleep(0)
            return await _answers(reader, len(sent))

    assert asyncio.run(run()) == [r.expected() for r in sent]
