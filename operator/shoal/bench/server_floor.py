"""HTTP servers with nothing behind them, for `router_http --server-floors`:
what answering one small request costs a server alone on the router's core.

- `aiohttp-server`: aiohttp with an Application (no access log, handler
  cancellation), as the router was served until session 27, one catch-all
  handler that reads and decodes the body and answers a fixed completion.
- `aiohttp-lowlevel`: the same handler on aiohttp's low-level `web.Server`,
  without an Application, as the router is served now (router/dispatch.py):
  what aiohttp's protocol, parser and response writing cost without its
  application layer (routing, `web.Request`).
- `protocol-server`: the least a Python server on uvloop can cost: an asyncio
  protocol on httptools (llhttp) that decodes the body and writes the same
  answer. Not a server to deploy (no limits, no timeouts, no streaming): a
  floor, to tell how much of the router's cost per request is its server's.
- `protocol-tasked`: the same protocol, answering from a task per request, as
  a server must whose handler awaits (the router's awaits its engine): what a
  hand-written server for the router could cost, on Python 3.11 (no eager
  tasks), before any of its limits and timeouts.
"""

from __future__ import annotations

import asyncio
import enum
from typing import cast

import httptools
import orjson
import uvloop
from aiohttp import web

from shoal.procs import HOST

ANSWER = orjson.dumps(
    {
        "id": "cmpl-floor",
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
)
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


class FloorServer(enum.StrEnum):
    AIOHTTP = "aiohttp-server"
    AIOHTTP_LOWLEVEL = "aiohttp-lowlevel"
    PROTOCOL = "protocol-server"
    PROTOCOL_TASKED = "protocol-tasked"


async def answer(request: web.BaseRequest) -> web.Response:
    raw = await request.read()
    if raw:
        orjson.loads(raw)
    return web.Response(body=ANSWER, content_type="application/json")


def answering_app() -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


def answering_server() -> web.Server:
    return web.Server(answer, access_log=None, handler_cancellation=True)


class Answering(asyncio.Protocol):
    """HTTP/1.1 keep-alive: each complete request gets the fixed answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.body:
            orjson.loads(b"".join(self.body))
            self.body.clear()
        assert self.transport is not None
        self.transport.write(_HEAD % len(ANSWER) + ANSWER)


async def _answer_later(body: bytes, transport: asyncio.Transport) -> None:
    if body:
        orjson.loads(body)
    transport.write(_HEAD % len(ANSWER) + ANSWER)


class AnsweringTasked(Answering):
    """`Answering`, with each answer written by a task of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.body.clear()
        assert self.transport is not None
        self.loop.create_task(_answer_later(body, self.transport))


_PROTOCOLS: dict[FloorServer, type[Answering]] = {
    FloorServer.PROTOCOL: Answering,
    FloorServer.PROTOCOL_TASKED: AnsweringTasked,
}


async def _serve(kind: FloorServer, port: int) -> None:
    protocol = _PROTOCOLS.get(kind)
    if protocol is not None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(protocol, HOST, port, backlog=1024)
        await server.serve_forever()
        return
    runner: web.BaseRunner = (
        web.AppRunner(answering_app(), access_log=None, handler_cancellation=True)
        if kind is FloorServer.AIOHTTP
        else web.ServerRunner(answering_server())
    )
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    await asyncio.Event().wait()


def serve(kind: FloorServer, port: int) -> None:
    """Serve until killed."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(kind, port))
