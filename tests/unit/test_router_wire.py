"""The answer head the router's server writes (router/wire.py): the server's
own framing and identity replace a handler's, and `Date` is the current
second's."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

import pytest
from multidict import CIMultiDict

from shoal.router import wire


def _head(length: int | None = 7, keep_alive: bool = True, version: str = "1.1") -> dict[str, str]:
    headers = CIMultiDict(
        {
            "Content-Type": "application/json",
            "Server": "engine",
            "Content-Length": "999",
            "Transfer-Encoding": "chunked",
            "Date": "Thu, 01 Jan 1970 00:00:00 GMT",
        }
    )
    raw = wire.answer_head(200, headers, length=length, keep_alive=keep_alive, version=version)
    lines = raw.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and raw.endswith(b"\r\n\r\n")
    names = [line.partition(": ")[0].lower() for line in lines[1:] if line]
    assert len(names) == len(set(names)), names  # a handler's framing is not repeated
    return {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}


def test_the_server_frames_and_dates_the_answer_not_the_handler() -> None:
    head = _head()
    assert head["content-length"] == "7"
    assert "transfer-encoding" not in head and "server" not in head
    assert head["content-type"] == "application/json"
    assert abs(parsedate_to_datetime(head["date"]).timestamp() - time.time()) < 2


def test_an_unsized_answer_is_chunked_or_closed_by_version() -> None:
    assert _head(length=None)["transfer-encoding"] == "chunked"
    old = _head(length=None, version="1.0", keep_alive=False)
    assert "transfer-encoding" not in old and old["connection"] == "close"
    assert _head(version="1.0")["connection"] == "keep-alive"


def test_the_date_follows_the_clock_second_by_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_800_000_000.2]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    first = _head()["date"]
    clock[0] += 0.5
    assert _head()["date"] == first
    clock[0] += 1
    assert parsedate_to_datetime(_head()["date"]).timestamp() == 1_800_000_001
