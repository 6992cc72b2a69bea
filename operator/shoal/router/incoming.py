"""A client's request as the router's server (router/connections.py) hands it
to a handler, and what a handler answers: a `web.Response` the server writes,
or `Streamed`, for an answer the handler wrote itself through `stream_head`
and `stream_write` (the server ends it, with `stream_end`, once the handler
returns)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy
from yarl import URL

from shoal.router.wire import answer_head

# A body piece smaller than this joins the one before it (Incoming.feed).
_SMALL_PIECE = 4096


class BodyTooLarge(Exception):
    """The body ran past the server's bound (`client_max_size`)."""


@dataclass(frozen=True, slots=True)
class Streamed:
    """An answer already written to the client by its handler."""

    status: int


Answer = web.Response | Streamed

_NO_QUERY: MultiDictProxy[str] = MultiDictProxy(MultiDict())


class Incoming:
    """One request: its method, target, headers, and its body, which may
    still be arriving while the handler runs (`read` waits for it)."""

    __slots__ = (
        "_chunks",
        "_complete",
        "_discarded",
        "_too_large",
        "_waiter",
        "chunked",
        "drain",
        "head_only",
        "headers",
        "keep_alive",
        "max_body",
        "method",
        "path",
        "path_safe",
        "query_string",
        "remote",
        "size",
        "streamed",
        "transport",
        "version",
    )

    scheme = "http"

    def __init__(
        self,
        *,
        method: str,
        path: str,
        query_string: str,
        version: str,
        headers: CIMultiDict[str],
        remote: str | None,
        keep_alive: bool,
        max_body: int,
        transport: asyncio.Transport,
        drain: Callable[[], Awaitable[None]],
    ) -> None:
        self.method = method
        self.path = path  # as sent, percent-encoded
        # What the dispatch matches: percent-decoded except `%2F` and `%25`
        # (yarl's path_safe, as aiohttp gave it).
        self.path_safe = path if "%" not in path else URL.build(path=path, encoded=True).path_safe
        self.query_string = query_string
        self.version = version  # "1.1" or "1.0"
        self.headers = CIMultiDictProxy(headers)
        self.remote = remote
        self.keep_alive = keep_alive
        self.max_body = max_body
        self.head_only = method == "HEAD"
        self.transport = transport
        self.drain = drain  # waits until the client took what was written
        self._chunks: list[bytes | bytearray] = []
        self.size = 0
        self._complete = False
        self._too_large = False
        self._discarded = False
        self._waiter: asyncio.Future[None] | None = None
        self.streamed = False  # the handler wrote its answer's head
        self.chunked = False  # ... as HTTP/1.1 chunks

    # ---- what handlers read
    @property
    def query(self) -> MultiDictProxy[str]:
        if not self.query_string:
            return _NO_QUERY
        return URL.build(query_string=self.query_string, encoded=True).query

    @property
    def raw_path_qs(self) -> str:
        """The target as sent (origin form), for the engine."""
        return f"{self.path}?{self.query_string}" if self.query_string else self.path

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        # The parser refuses a malformed one, and a body framed two ways.
        return int(value) if value is not None and value.isdigit() else None

    def body_complete(self) -> bool:
        return self._complete

    async def read(self) -> bytes:
        """The whole body, once it has arrived; BodyTooLarge past the bound."""
        while not self._complete:
            if self._too_large:
                break
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._too_large:
            raise BodyTooLarge
        chunks = self._chunks
        if len(chunks) != 1 or isinstance(chunks[0], bytearray):
            chunks[:] = [b"".join(chunks)]
        return bytes(chunks[0])

    # ---- what the connection feeds
    def feed(self, data: bytes) -> None:
        size = self.size = self.size + len(data)
        if self._discarded:
            return
        if size > self.max_body:
            if not self._too_large:
                self._too_large = True
                self._chunks.clear()
                self._wake()
            return  # counted, dropped: the parser still reads to its end
        chunks = self._chunks
        if chunks and len(data) < _SMALL_PIECE:
            # Small pieces (a body sent in tiny chunks) go into one buffer:
            # as objects of their own each cost ~40 bytes per byte.
            last = chunks[-1]
            if not isinstance(last, bytearray):
                chunks[-1] = last = bytearray(last)
            last += data
            return
        chunks.append(data)

    def discard(self) -> None:
        """Nobody will read the rest of the body: drop it as it comes."""
        self._discarded = True
        self._chunks.clear()

    def finish(self) -> None:
        self._complete = True
        if not self._chunks:
            self._chunks.append(b"")
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- a streamed answer
    def stream_head(
        self,
        status: int,
        headers: CIMultiDict[str] | CIMultiDictProxy[str],
        first: bytes,
        *,
        length: int | None = None,
    ) -> None:
        """Send a streamed answer's head with its first body bytes, in one
        write: as HTTP/1.1 chunks, or to an HTTP/1.0 client as they come,
        ended by closing the connection. `length`: the body's, when known;
        an HTTP/1.0 client gets it, to tell an answer cut short from a whole
        one (chunks tell an HTTP/1.1 client)."""
        self.streamed = True
        self.chunked = chunked = self.version == "1.1"
        if not chunked:
            self.keep_alive = False
        head = answer_head(
            status,
            headers,
            length=None if chunked else length,
            keep_alive=self.keep_alive,
            version=self.version,
        )
        if not self.transport.is_closing():  # else the server cancels the handler
            self.transport.write(head + self.framed(first) if first else head)

    def stream_write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(self.framed(data))

    def stream_end(self) -> None:
        """The server's, once the handler returned: a handler calling it too
        would send a second last chunk, which the client would read as the
        start of the next answer."""
        if self.chunked and not self.transport.is_closing():
            self.transport.write(b"0\r\n\r\n")

    def framed(self, data: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data


Handler = Callable[[Incoming], Awaitable[Answer]]
