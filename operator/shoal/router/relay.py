"""Relaying a streamed answer to the client, one network read at a time."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp.abc import AbstractStreamWriter

from shoal.router.upstream import Exchange


class ChunkRelay:
    """Writes each piece of an engine's streamed body to the client as one
    HTTP/1.1 chunk (or as it is, to an HTTP/1.0 client: the connection's end
    ends the body), from the engine connection's read callback."""

    __slots__ = ("_draining", "_high", "chunked", "exchange", "transport", "writer")

    def __init__(
        self,
        transport: asyncio.Transport,
        exchange: Exchange,
        writer: AbstractStreamWriter,
        *,
        chunked: bool,
    ) -> None:
        self.transport = transport
        self.exchange = exchange
        self.writer = writer
        self.chunked = chunked
        # Past the transport's own high-water mark (where it pauses aiohttp's
        # writes too) stop reading from the engine until the client drains:
        # the kernel's window then slows the engine instead of our memory
        # growing.
        self._high = transport.get_write_buffer_limits()[1]
        self._draining: asyncio.Task[None] | None = None

    def __call__(self, chunk: bytes) -> None:
        transport = self.transport
        if transport.is_closing():
            return  # the client is gone: aiohttp cancels the handler, which drops the engine
        transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if self.chunked else chunk)
        if self._draining is None and transport.get_write_buffer_size() > self._high:
            self.exchange.pause()
            self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            with contextlib.suppress(ConnectionError):
                await self.writer.drain()
        finally:
            self._draining = None
            self.exchange.resume()
