"""What a stream's client is sent, write by write: the router in this process
(on asyncio's own loop, whose transports can be watched) in front of an
engine stand-in streaming over loopback."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from shoal.router.app import Discovery, Router
from shoal.router.config import RouterConfig
from shoal.router.incoming import Answer, Incoming
from tests.integration.procs import MODEL
from tests.integration.test_router_observed import wait_for_scrape
from tests.router_served import router_client

CHUNKS = (b"data: first\n\n", b"data: second\n\n")


class _StreamingEngine(BaseHTTPRequestHandler):
    """Streams CHUNKS, a pause apart, as HTTP/1.1 chunks; its headers go out
    before the first one, as vLLM's do."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # /metrics, /health: an idle engine
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for n, chunk in enumerate(CHUNKS):
            if n:
                time.sleep(0.2)  # each chunk its own network read
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _engine() -> Iterator[str]:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _StreamingEngine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{engine.server_address[1]}"
    finally:
        engine.shutdown()


async def _stream_and_watch(url: str) -> tuple[bytes, list[bytes]]:
    """The client's stream, and the router's writes to the client's connection."""
    writes: list[bytes] = []

    def watch(request: Incoming) -> None:
        # Every write to this connection from here on, as the kernel is asked.
        transport = request.transport
        assert transport is not None
        write = transport.write

        def counted(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            write(data)

        def counted_lines(parts: Iterable[bytes | bytearray | memoryview]) -> None:
            counted(b"".join(parts))

        transport.write = counted  # type: ignore[method-assign]
        transport.writelines = counted_lines  # type: ignore[method-assign,assignment]

    router_ = Router(RouterConfig.model_validate({}), Discovery(endpoints=[url]))
    handle = router_.answer

    async def watched(request: Incoming) -> Answer:
        watch(request)  # before anything is written for this request
        return await handle(request)

    router_.answer = watched  # type: ignore[method-assign]
    await router_.start()
    try:
        async with router_client(router_) as client:
            await wait_for_scrape(router_)
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}
            answer = await client.post("/v1/completions", json=body)
            assert answer.status == 200
            return await answer.read(), writes
    finally:
        await router_.stop()


def test_a_streams_headers_go_out_in_one_write_with_its_first_chunk() -> None:
    with _engine() as url:
        streamed, writes = asyncio.run(_stream_and_watch(url))
    assert streamed == b"".join(CHUNKS)
    # One system call and one wake-up of the client fewer per stream, on the
    # way to its first token: the headers wait for it.
    assert writes[0].startswith(b"HTTP/1.1 200 "), writes
    assert CHUNKS[0] in writes[0], writes
    # And each later piece goes out as it comes, not held for the next.
    assert [w for w in writes if CHUNKS[1] in w] == [b"%x\r\n%s\r\n" % (len(CHUNKS[1]), CHUNKS[1])]
