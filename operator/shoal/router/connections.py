"""Client connections, below the routes: a deadline for a request's headers,
a bound on open connections, `Expect: 100-continue`, answers that name no
server software, and the HTTP layer's own errors (aiohttp's parser refusing
a request) as OpenAI-shaped JSON that echoes nothing.

aiohttp (3.14) has neither a header deadline nor a connection bound, and
answers parser errors in plain text quoting the bytes it refused, with a
logged traceback. Its RequestHandler is the one place that sees a connection
before any request exists, so it is subclassed here, with `handle_error`
(the documented hook of its error answers) overridden; `GuardedServer`, on
aiohttp's low-level Server, makes our handler class and our requests.
Without an aiohttp Application (router/dispatch.py says why), what it did
for every request is done here: the body's size bound, the answer to
`Expect`. tests/integration/test_router_connections.py pins that contract."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from shoal.router.errors import Handler, error_body, error_response

log = logging.getLogger("shoal.router")

# Headers as aiohttp's parser bounds them, said here so the cost of a
# hostile header section is plain: at most 128 fields of 8 KiB each.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128
# An idle kept-alive client connection is closed after this (nginx's
# keepalive_timeout); aiohttp's own default is an hour.
KEEPALIVE_SECONDS = 75.0


def canned(status: int, reason: str, message: str, *, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written where no
    request (and so no aiohttp response) exists."""
    body = json.dumps(error_body(status, message)).encode()
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n%s\r\n%s" % (status, reason.encode(), len(body), extra, body)
    )


class RouterRequest(web.BaseRequest):
    """A request whose answer names no server software: aiohttp adds
    `Server: Python/... aiohttp/...` while preparing any answer, after the
    headers set before, then calls this hook."""

    __slots__ = ()

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        response.headers.popall(hdrs.SERVER, None)


async def _expected(request: web.BaseRequest) -> web.StreamResponse | None:
    """What aiohttp's Application answered to `Expect` (RFC 9110 10.1.1):
    100 Continue, so a client that waits for it (curl, for a body over 1 KiB)
    sends the body at once, or 417 for an expectation it cannot meet."""
    if request.version != HttpVersion11:
        return None
    if request.headers[hdrs.EXPECT].lower() != "100-continue":
        return error_response(417, "Only 'Expect: 100-continue' is supported.", param="Expect")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer proper is still to start
    await request.writer.drain()
    return None


class GuardedServer(web.Server):
    """aiohttp's low-level Server, making `ClientConnection`s and
    `RouterRequest`s bounded to `client_max_size` bytes of body."""

    def __init__(
        self,
        handler: Handler,
        *,
        header_seconds: float,
        max_connections: int,
        client_max_size: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(self._answer, request_factory=self._request, **kwargs)
        self._handler = handler
        self._client_max_size = client_max_size
        self.header_seconds = header_seconds
        self.max_connections = max_connections
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
        self.refused = 0  # connections refused for the bound, for tests and metrics

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> RouterRequest:
        return RouterRequest(
            message,
            payload,
            protocol,
            writer,
            task,
            self._loop,
            client_max_size=self._client_max_size,
        )

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        if hdrs.EXPECT in request.headers:
            refused = await _expected(request)
            if refused is not None:
                return refused
        return await self._handler(request)

    def full(self) -> bool:
        return len(self._connections) >= self.max_connections

    def __call__(self) -> RequestHandler:
        return ClientConnection(self, loop=self._loop, **self._kwargs)


class ClientConnection(RequestHandler):
    """One client connection. Its header deadline runs from the connection's
    start, and again from the first byte after each request: a request whose
    headers are not all parsed by then is answered 408 and the connection
    closed. (A deadline armed for one request that fires after the next one
    began is re-armed by that one's next bytes: at most twice the deadline.)"""

    __slots__ = ("_armed_at_count", "_header_timer", "_server")

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._server = manager
        self._header_timer: asyncio.TimerHandle | None = None
        self._armed_at_count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        if server.full():
            # Refused before aiohttp sees it: no task, no parser work.
            self._force_close = True
            server.refused += 1
            # uvloop's transports do not subclass asyncio's, but are one.
            writable = cast(asyncio.Transport, transport)
            writable.write(server.too_many)
            writable.close()
            return
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and not self._request_in_progress:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._armed_at_count = self._request_count
        self._header_timer = self._loop.call_later(self._server.header_seconds, self._late)

    def _late(self) -> None:
        self._header_timer = None
        if self._request_count != self._armed_at_count or self._request_in_progress:
            return  # the headers came
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._force_close = True
        transport.write(self._server.too_slow)
        transport.close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's own error answers (a request its parser refused, a
        handler's exception): OpenAI-shaped, naming the error's class, never
        the bytes; a client's mistake is logged at DEBUG only."""
        if request.writer.output_size > 0:
            # As aiohttp: bytes of an answer went out, no other can follow.
            raise ConnectionError("Response is sent already")
        kind = type(exc).__name__ if exc is not None else "error"
        if status >= 500:
            log.error("request from %s failed in the HTTP layer: %s", request.remote, kind)
            text = "The router failed on this request."
        else:
            log.debug("refused a malformed request from %s: %s", request.remote, kind)
            text = f"The request is not valid HTTP/1.1 ({kind})."
        response = web.Response(
            status=status,
            text=json.dumps(error_body(status, text)),
            content_type="application/json",
        )
        response.force_close()
        return response
