"""Relaying a streamed answer to the client, one network read at a time,
under the stream's deadlines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from shoal.router.upstream import Exchange


class ChunkRelay:
    """Writes each piece of an engine's streamed body to the client as one
    HTTP/1.1 chunk (or as it is, to an HTTP/1.0 client: the connection's end
    ends the body), from the engine connection's read callback.

    It also keeps the stream's deadlines: the first chunk by `first_chunk_by`,
    each next one within `stall_seconds` of the last, all by `deadline` (loop
    times). One timer per stream, re-armed only when it fires (a chunk costs
    a clock read, not a timer); when a deadline passes, the exchange is
    aborted with `failure` saying which."""

    __slots__ = (
        "_clock",
        "_deadline",
        "_draining",
        "_first",
        "_high",
        "_last",
        "_loop",
        "_stall",
        "_timer",
        "chunked",
        "drain",
        "exchange",
        "failure",
        "transport",
    )

    def __init__(
        self,
        transport: asyncio.Transport,
        exchange: Exchange,
        drain: Callable[[], Awaitable[None]],
        *,
        chunked: bool,
        stall_seconds: float,
        first_chunk_by: float,
        deadline: float,
    ) -> None:
        self.transport = transport
        self.exchange = exchange
        self.drain = drain
        self.chunked = chunked
        self.failure: str | None = None
        # Past the transport's own high-water mark (where it pauses the server's
        # writes too) stop reading from the engine until the client drains:
        # the kernel's window then slows the engine instead of our memory
        # growing.
        self._high = transport.get_write_buffer_limits()[1]
        self._draining: asyncio.Task[None] | None = None
        loop = self._loop = exchange.loop
        self._clock = loop.time
        self._stall = stall_seconds
        self._deadline = deadline
        # The first chunk waits for the engine's queue and prefill: it is due
        # by first_chunk_by, as if the last chunk came a stall before that.
        self._last = first_chunk_by - stall_seconds
        self._first = True
        self._timer = loop.call_at(min(first_chunk_by, deadline), self._check)

    def __call__(self, chunk: bytes) -> None:
        self._last = now = self._clock()
        if self._first:
            # From the first chunk on, the stall deadline is the nearer one.
            self._first = False
            self._timer.cancel()
            self._timer = self._loop.call_at(min(now + self._stall, self._deadline), self._check)
        transport = self.transport
        if transport.is_closing():
            return  # the client is gone: the server cancels the handler, which drops the engine
        transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if self.chunked else chunk)
        if self._draining is None and transport.get_write_buffer_size() > self._high:
            self.exchange.pause()
            self._draining = self._loop.create_task(self._drain())

    def stop(self) -> None:
        """The answer ended or failed. The engine's connection reads again at
        once: a drain still waiting on a slow client no longer holds it (its
        end often comes in the read that paused it), or it would go back to
        the pool paused, and the next request on it wait on this client."""
        self._timer.cancel()
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
            self.exchange.resume()

    def _check(self) -> None:
        now = self._clock()
        if self._draining is not None:
            self._last = now  # a slow client paused the engine: no stall of its
        due = self._last + self._stall
        if now >= self._deadline:
            self.failure = "The replica did not finish its answer in time."
        elif now >= due:
            self.failure = f"The replica stopped streaming for {self._stall:g} seconds."
        else:
            self._timer = self._loop.call_at(min(due, self._deadline), self._check)
            return
        self.exchange.abort(self.failure)

    async def _drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.drain()
        # Not reached once stopped (cancelled): `stop` resumed the exchange,
        # which may serve another request by now.
        self._draining = None
        self._last = self._clock()
        self.exchange.resume()
