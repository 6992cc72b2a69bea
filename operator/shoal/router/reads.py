"""The router's reads of answers it needs whole (engines' /metrics and
/v1/models, peers' placements): bounded in size, and JSON read by orjson,
whose depth limit refuses nesting that would exhaust Python's recursion
(a RecursionError, which no caller expects, where orjson raises ValueError)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson


class AnswerTooLarge(ValueError):
    """An answer past what its reader takes."""


async def read_whole(response: aiohttp.ClientResponse, *, limit: int) -> bytes:
    """The body to its end, however many network reads it comes in;
    AnswerTooLarge past `limit` bytes, read no further."""
    read = bytearray()
    async for chunk in response.content.iter_any():
        read += chunk
        if len(read) > limit:
            raise AnswerTooLarge(f"an answer larger than {limit} bytes")
    return bytes(read)


def loads(raw: bytes) -> Any:
    """JSON; ValueError if it is not (orjson.JSONDecodeError is one)."""
    return orjson.loads(raw)
