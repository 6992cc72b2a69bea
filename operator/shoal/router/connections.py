"""The router's HTTP/1.1 server: an asyncio protocol on httptools (llhttp),
with what a server facing any client needs: a deadline for a request's
headers, a bound on open connections and on the head's size, a body bound,
`Expect: 100-continue`, keep-alive with an idle timeout, pipelined requests
answered in order, and the HTTP layer's own refusals as OpenAI-shaped JSON
that echoes nothing. Answers name no server software.

Why not aiohttp's server (the router's until session 28): answering a small
request cost it 26-30 us of CPU where this protocol, with a task per request,
costs 9-10 us (`router_http --server-floors`), a fifth of the router's cost
per request; and the router's routes are a fixed table (router/dispatch.py),
so its request and response objects chose nothing. The upstream side is
hand-written on httptools for the same reason (router/upstream.py).
tests/integration/test_router_connections.py and test_router_hostile.py pin
the contract."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools
from aiohttp import web
from multidict import CIMultiDict

from shoal.router.errors import error_body, error_response, internal_error
from shoal.router.incoming import Answer, Handler, Incoming, Streamed
from shoal.router.wire import answer_head

log = logging.getLogger("shoal.router")

# A request's target and each header field are bounded, as aiohttp bounded
# them, so the cost of a hostile head is plain: at most 128 fields of 8 KiB.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128
_MAX_HEAD_BYTES = MAX_LINE_BYTES * (MAX_HEADERS + 1)
# An idle kept-alive client connection is closed after this (nginx's
# keepalive_timeout).
KEEPALIVE_SECONDS = 75.0
# Pipelined requests parsed ahead of the one being answered, before the
# connection holds what comes next unparsed; and how much it holds before it
# stops reading. Held rather than unread: a connection that stops reading
# does not notice its client leave (until its next write fails), and so does
# not cancel the request under way, nor the engine's.
_AHEAD = 4
_HELD_BYTES = 64 * 1024


def canned(status: int, reason: str, message: str, *, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written where no
    handler answers."""
    body = json.dumps(error_body(status, message)).encode()
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n%s\r\n%s" % (status, reason.encode(), len(body), extra, body)
    )


class _Refused(Exception):
    """Raised in a parser callback: the head is beyond the bounds."""


class HttpServer:
    """A protocol factory for `loop.create_server`, answering with `handler`."""

    def __init__(
        self,
        handler: Handler,
        *,
        header_seconds: float,
        max_connections: int,
        client_max_size: int,
    ) -> None:
        self.handler = handler
        # Told of each connection refused for the bound (the router's metrics).
        self.on_refused: Callable[[], None] | None = None
        self.loop = asyncio.get_running_loop()
        self.header_seconds = header_seconds
        self.max_connections = max_connections
        self.client_max_size = client_max_size
        self.connections: set[ClientConnection] = set()
        # False once the router stops: each answer then closes its
        # connection, so a kept-alive client reconnects (to another router).
        self.keep_alive = True
        self.too_slow = canned(
            408,
            "Request Timeout",
            f"The request headers did not arrive within {header_seconds:g} seconds.",
        )
        self.too_many = canned(
            503,
            "Service Unavailable",
            "The router has too many open connections; retry later.",
            extra=b"Retry-After: 1\r\n",
        )

    def __call__(self) -> ClientConnection:
        return ClientConnection(self)

    def stop_keeping_alive(self) -> None:
        self.keep_alive = False
        for connection in self.connections:
            connection.stop_keeping_alive()

    def close_idle(self, seconds: float) -> None:
        """Close the connections idle between requests for `seconds` or more."""
        since = self.loop.time() - seconds
        for connection in list(self.connections):
            connection.close_if_idle(since)

    async def shutdown(self, seconds: float) -> None:
        """Close idle connections now, the others once their answers are out
        (waiting at most `seconds`); call after the listener closed."""
        for connection in list(self.connections):
            connection.close_when_idle()
        deadline = self.loop.time() + seconds
        while self.connections and self.loop.time() < deadline:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.abort()


class ClientConnection(asyncio.Protocol):
    """One client connection. Its header deadline runs from the connection's
    start, and from the first byte of each next request: a request whose
    headers are not all parsed by then is answered 408 and the connection
    closed. Requests are answered one at a time, in order, each by a task of
    its own, which a client that disconnects cancels (so the engine's
    connection is dropped and the engine stops)."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._remote: str | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._in_head = False
        self._head_bytes = 0
        self._framed_bytes = 0  # read since the last head ended
        self._max_framed = 2 * server.client_max_size + _MAX_HEAD_BYTES
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._parsing: Incoming | None = None  # whose body the parser is reading
        self._queued: deque[Incoming] = deque()  # parsed, waiting for `_active`
        self._active: Incoming | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_words: bytes | None = None  # a refusal, once the answers before it are out
        self._closing = False  # no request after the ones parsed
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._held = bytearray()  # read while `_AHEAD` requests are queued, unparsed
        self._reading_paused = False
        # Answered before its body came: the body is read and dropped, by a
        # deadline, so the connection serves on.
        self._discarding: Incoming | None = None
        self._discard_timer: asyncio.TimerHandle | None = None

    # ---- the connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but are one.
        self.transport = writable = cast(asyncio.Transport, transport)
        server = self._server
        if len(server.connections) >= server.max_connections:
            # Refused before anything is parsed: no task, no parser work.
            self._closing = True
            if server.on_refused is not None:
                server.on_refused()
            writable.write(server.too_many)
            writable.close()
            return
        server.connections.add(self)
        peer = writable.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) and peer else None
        self._header_timer = self._loop.call_later(server.header_seconds, self._late)
        self._idle_since = self._loop.time()
        self._idle_timer = self._loop.call_later(KEEPALIVE_SECONDS, self._check_idle)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._server.connections.discard(self)
        for timer in (self._header_timer, self._idle_timer, self._discard_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._idle_timer = self._discard_timer = None
        if self._task is not None:
            # The client is gone: so is its request (a read of its body too).
            self._task.cancel()
        self._queued.clear()
        self._held.clear()
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if len(self._queued) >= _AHEAD:
            held = self._held
            held += data
            if len(held) > _HELD_BYTES and not self._reading_paused:
                self._reading_paused = True
                assert self.transport is not None
                self.transport.pause_reading()
            return
        try:
            if self._in_head:
                self._head_bytes += len(data)
                if self._head_bytes > _MAX_HEAD_BYTES:
                    raise _Refused("headers too large")
            else:
                # A chunked body's framing and trailer fields are neither head
                # nor body: bounded at twice the body limit (a trailer that
                # never ended was read without end, tiny chunks cost 22x).
                self._framed_bytes += len(data)
                if self._framed_bytes > self._max_framed:
                    raise _Refused("body framing too large")
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An upgrade (h2c, websocket) is not offered: what was parsed is
            # answered as HTTP/1.1, and then the connection closes.
            self._closing = True
            self._refuse_after(None)
            return
        except (httptools.HttpParserError, _Refused) as error:
            # A callback's own refusal comes wrapped in HttpParserCallbackError.
            cause = error.__context__ if isinstance(error.__context__, _Refused) else error
            self._closing = True
            broken = self._parsing
            if broken is not None and broken is self._discarding:
                # Its answer went out already: nothing more to say.
                self._refuse_after(None)
                return
            if broken is not None:
                # Its body is broken: so is the request, answered instead
                # (the requests before it are answered first).
                self._parsing = None
                if self._queued and self._queued[-1] is broken:
                    self._queued.pop()
                elif broken is self._active and not broken.streamed:
                    assert self._task is not None
                    self._task.cancel()
                    self._task = self._active = None
            self._refuse_after(self._malformed(cause))
            return
        if self._in_head and self._header_timer is None:
            # A head split across reads: its deadline runs from this read.
            self._header_timer = self._loop.call_later(self._server.header_seconds, self._late)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        """Wait until the client has taken what was written (below the
        transport's high-water mark); ConnectionResetError if it left."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed its connection")
        if not self._write_paused:
            return
        drained = self._drained
        if drained is None or drained.done():
            drained = self._drained = self._loop.create_future()
        await drained
        if transport.is_closing():
            raise ConnectionResetError("the client closed its connection")

    def stop_keeping_alive(self) -> None:
        """The last request known closes the connection once answered (those
        pipelined before it are answered first; any after it are not read)."""
        last = self._queued[-1] if self._queued else self._active
        if last is not None:
            last.keep_alive = False

    def close_if_idle(self, since: float) -> None:
        """Close it if it has been idle, between requests, since `since` (a
        client sending just then would lose its request, as at keep-alive's
        timeout: so only one idle for a while)."""
        if not self._busy() and self._idle_since <= since and self.transport is not None:
            self.transport.close()

    def _busy(self) -> bool:
        return self._active is not None or self._in_head or self._parsing is not None

    def close_when_idle(self) -> None:
        self._closing = True
        if self._task is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ---- parser callbacks (httptools)
    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._fields = []

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE_BYTES:
            raise _Refused("target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > MAX_LINE_BYTES:
            raise _Refused("header field too long")
        fields = self._fields
        if len(fields) >= MAX_HEADERS:
            raise _Refused("too many header fields")
        fields.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._framed_bytes = 0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        parser = self._parser
        url = self._url
        if url[:1] != b"/":
            if url == b"*" or not url.startswith((b"http://", b"https://")):
                raise _Refused("target not in origin or absolute form")
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        path, _, query = url.partition(b"?")
        path, _, _ = path.partition(b"#")
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in self._fields:
            headers.add(
                name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")
            )
        assert self.transport is not None
        request = Incoming(
            method=parser.get_method().decode("ascii"),
            path=path.decode("utf-8", "surrogateescape"),
            query_string=query.decode("utf-8", "surrogateescape"),
            version=parser.get_http_version(),
            headers=headers,
            remote=self._remote,
            keep_alive=parser.should_keep_alive() and self._server.keep_alive,
            max_body=self._server.client_max_size,
            transport=self.transport,
            drain=self.drain,
        )
        self._parsing = request
        if self._active is None:
            self._start(request)
        else:
            # From `_AHEAD` queued on, later reads are held (the rest of this
            # one is parsed still).
            self._queued.append(request)

    def on_body(self, body: bytes) -> None:
        parsing = self._parsing
        if parsing is not None:
            parsing.feed(body)
            if parsing is self._discarding and parsing.size > self._server.client_max_size:
                raise _Refused("discarded body too large")

    def on_message_complete(self) -> None:
        parsing = self._parsing
        if parsing is not None:
            parsing.finish()
            self._parsing = None
            if parsing is self._discarding:
                self._discarding = None
                if self._discard_timer is not None:
                    self._discard_timer.cancel()
                    self._discard_timer = None
                self._idle_since = self._loop.time()

    # ---- answering
    def _start(self, request: Incoming) -> None:
        self._active = request
        self._task = self._loop.create_task(self._answer(request))

    async def _answer(self, request: Incoming) -> None:
        try:
            answer = await self._respond(request)
        except Exception as error:  # a handler's bug, past its own guard
            answer = internal_error(request, error)
        self._task = None
        self._finish(request, answer)

    async def _respond(self, request: Incoming) -> Answer:
        expect = request.headers.get("Expect")
        if expect is not None and request.version == "1.1":
            # RFC 9110 10.1.1: a client that waits (curl, for a body over
            # 1 KiB) is told to send its body at once.
            if expect.lower() != "100-continue":
                refused = error_response(
                    417, "Only 'Expect: 100-continue' is supported.", param="Expect"
                )
                refused.force_close()
                return refused
            if not request.body_complete() and not request.transport.is_closing():
                request.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return await self._server.handler(request)

    def _finish(self, request: Incoming, answer: Answer) -> None:
        transport = self.transport
        assert transport is not None
        self._active = None
        keep = request.keep_alive and not (
            isinstance(answer, web.Response) and answer.keep_alive is False
        )
        # A body not read whole is read and dropped after the answer (as
        # nginx discards one), unless it is longer than the bound.
        unread = not request.body_complete()
        if unread and (self._closing or (request.content_length or 0) > request.max_body):
            keep = False
        # A client gone meanwhile: its connection_lost clears the queue.
        more = keep and not unread and bool(self._queued) and not transport.is_closing()
        last = not keep or (self._closing and not more)
        if isinstance(answer, Streamed) or request.streamed:
            request.stream_end()
        elif not transport.is_closing():
            body = answer.body
            data = body if isinstance(body, bytes) else b""
            headers = answer.headers
            if data and "Content-Type" not in headers:
                headers["Content-Type"] = "application/octet-stream"
            head = answer_head(
                answer.status,
                headers,
                length=len(data),
                keep_alive=not last,
                version=request.version,
                reason=answer.reason,
            )
            transport.write(head if request.head_only or not data else head + data)
        if more:
            self._start(self._queued.popleft())
            if len(self._queued) < _AHEAD and (self._held or self._reading_paused):
                self._release()
        elif last:
            self._closing = True
            self._queued.clear()
            self._refuse_after(self._last_words)
        elif unread:
            request.discard()
            self._discarding = request
            self._discard_timer = self._loop.call_later(
                self._server.header_seconds, self._discard_late
            )
        else:
            self._idle_since = self._loop.time()

    def _release(self) -> None:
        """Parse what was held (after the next request started, so what it
        parses queues behind it), and read again."""
        if self._reading_paused:
            self._reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        if self._held:
            held = bytes(self._held)
            self._held.clear()
            self.data_received(held)

    def _refuse_after(self, words: bytes | None) -> None:
        """Say `words` (if any) and close, once the answers before are out."""
        transport = self.transport
        if transport is None:
            return
        if self._active is not None or self._queued:
            self._last_words = words
            return
        if words is not None and not transport.is_closing():
            transport.write(words)
        transport.close()

    def _malformed(self, error: BaseException) -> bytes:
        """aiohttp answered its parser's refusals 400 in plain text quoting
        the bytes it refused; here: OpenAI-shaped, naming what is wrong in
        general terms, logged at DEBUG only (it is the client's mistake)."""
        kind = str(error) if isinstance(error, _Refused) else type(error).__name__
        log.debug("refused a malformed request from %s: %s", self._remote, kind)
        return canned(400, "Bad Request", f"The request is not valid HTTP/1.1 ({kind}).")

    # ---- deadlines
    def _late(self) -> None:
        """Armed at the connection's start and by a read that leaves a head
        unfinished; cancelled when a head is whole."""
        self._header_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._closing = True
        self._refuse_after(self._server.too_slow)

    def _discard_late(self) -> None:
        """A body being dropped stopped coming: the connection goes."""
        self._discard_timer = None
        if self._discarding is not None and self.transport is not None:
            self._closing = True
            self.transport.close()

    def _check_idle(self) -> None:
        """One timer per connection, re-armed when it fires: a request costs
        a clock read, not a timer."""
        self._idle_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = self._loop.time()
        busy = self._busy()
        due = self._idle_since + KEEPALIVE_SECONDS
        if not busy and now >= due:
            transport.close()
            return
        self._idle_timer = self._loop.call_at(
            now + KEEPALIVE_SECONDS if busy else due, self._check_idle
        )
