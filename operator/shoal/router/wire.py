"""An answer's head as the router's server writes it: the status line, the
handler's headers (never a `Server`, nor framing headers of its own: the
server frames), `Date`, `Content-Length` or chunking, and `Connection`."""

from __future__ import annotations

import time
from email.utils import formatdate
from functools import lru_cache
from http import HTTPStatus

from multidict import CIMultiDict, CIMultiDictProxy

# Framing and identity are the server's: a handler's own (an engine's,
# relayed) would contradict what it writes.
_OWN = frozenset(
    ("content-length", "transfer-encoding", "connection", "keep-alive", "server", "date")
)

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


@lru_cache(maxsize=1)
def _date_line(second: int) -> bytes:
    # Formatted once a second: every answer in that second shares it.
    return b"Date: %s\r\n" % formatdate(second, usegmt=True).encode()


def answer_head(
    status: int,
    headers: CIMultiDict[str] | CIMultiDictProxy[str],
    *,
    length: int | None,
    keep_alive: bool,
    version: str,
    reason: str | None = None,
) -> bytes:
    """`length` None frames the body as HTTP/1.1 chunks, or, to an HTTP/1.0
    client, by closing the connection (so `keep_alive` must then be False)."""
    phrase = reason.encode() if reason else _REASONS.get(status, b"Unknown")
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, phrase)]
    for name, value in headers.items():
        if name.lower() not in _OWN:
            lines.append(b"%s: %s\r\n" % (name.encode(), value.encode("utf-8", "surrogateescape")))
    lines.append(_date_line(int(time.time())))
    if length is not None:
        lines.append(b"Content-Length: %d\r\n" % length)
    elif version == "1.1":
        lines.append(b"Transfer-Encoding: chunked\r\n")
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    elif version == "1.0":
        lines.append(b"Connection: keep-alive\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)
