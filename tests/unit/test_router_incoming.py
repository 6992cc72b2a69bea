"""A request body as the connection feeds it (`Incoming`): whole, and at
about its own size in memory however small the pieces it came in."""

from __future__ import annotations

import asyncio
import tracemalloc

from multidict import CIMultiDict

from shoal.router.incoming import Incoming


def _incoming(max_body: int) -> Incoming:
    async def drained() -> None:
        return None

    return Incoming(
        method="POST",
        path="/v1/completions",
        query_string="",
        version="1.1",
        headers=CIMultiDict(),
        remote="127.0.0.1",
        keep_alive=True,
        max_body=max_body,
        transport=asyncio.Transport(),
        drain=drained,
    )


def test_a_body_of_tiny_pieces_costs_about_its_size() -> None:
    """Each piece the parser hands over was kept as a bytes object of its
    own: a body sent as 1-byte chunks cost ~40 bytes of memory per byte."""
    size = 1 << 20
    incoming = _incoming(4 * size)
    pieces = [bytes([65 + i % 26]) for i in range(size)]
    tracemalloc.start()
    try:
        for piece in pieces:
            incoming.feed(piece)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    incoming.finish()
    assert held < 3 * size, held
    assert asyncio.run(incoming.read()) == b"".join(pieces)


def test_large_pieces_are_kept_as_they_came() -> None:
    incoming = _incoming(1 << 20)
    first, second = b"a" * 70_000, b"b" * 70_000
    incoming.feed(first)
    incoming.feed(second)
    incoming.feed(b"c")
    incoming.finish()
    assert asyncio.run(incoming.read()) == first + second + b"c"
