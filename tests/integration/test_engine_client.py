"""The control plane's engine client against simulated engines: each call's
answer typed, each failure told apart (no answer, no answer in time, an
error answer with vLLM's error body, a scrape that is not vLLM's)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.engine import endpoints
from shoal.engine.client import EngineClient, Usage
from shoal.engine.errors import (
    BadAnswer,
    BadMetrics,
    EngineError,
    ErrorStatus,
    TimedOut,
    Unreachable,
)
from tests.integration.procs import MODEL, free_port, set_fault, sims
from tests.integration.test_router_engine_fuzz import (
    BODIES,
    HEADER_LINES,
    STATUS_LINES,
    broken_engine,
)

T = TypeVar("T")


def call(ask: Callable[[EngineClient], Awaitable[T]]) -> T:
    async def once() -> T:
        async with EngineClient() as engine:
            return await ask(engine)

    return asyncio.run(once())


def test_an_engine_answers_each_call_typed(tmp_path: Path) -> None:
    with sims(1, tmp_path) as (url,):
        assert call(lambda e: e.health(url)) == 200
        assert call(lambda e: e.models(url)) == [MODEL]
        assert call(lambda e: e.version(url))
        tokens = call(lambda e: e.tokenize(url, model=MODEL, prompt="hello there"))
        assert tokens and all(isinstance(t, int) for t in tokens)
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 1}
        usage = call(lambda e: e.complete(url, path=endpoints.COMPLETIONS, body=body, deadline=10))
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(tokens), 1)
        call(lambda e: e.canary(url, model=MODEL, deadline=10))
        metrics = call(lambda e: e.metrics(url))
        assert metrics.requests == 2 and metrics.in_flight == 0
        assert metrics.kv_pool is not None


def test_an_engine_error_answer_carries_vllms_error_body(tmp_path: Path) -> None:
    with sims(1, tmp_path) as (url,), pytest.raises(ErrorStatus) as refused:
        call(lambda e: e.canary(url, model="nope", deadline=10))
    assert refused.value.status == 404
    assert refused.value.error is not None and refused.value.error.type == "NotFoundError"


def test_a_broken_or_hung_metrics_endpoint_is_an_error_not_an_idle_engine(
    tmp_path: Path,
) -> None:
    with sims(1, tmp_path) as (url,):
        set_fault(url, metrics="garbage")
        with pytest.raises(BadMetrics):
            call(lambda e: e.metrics(url))
        set_fault(url, metrics="nan")  # well-formed, but no load to weigh
        with pytest.raises(BadMetrics, match="not a number"):
            call(lambda e: e.metrics(url))
        set_fault(url, metrics="endless")  # read so far, not whole nor to the deadline
        started = time.monotonic()
        with pytest.raises(BadAnswer, match="larger than"):
            call(lambda e: e.metrics(url, deadline=30))
        assert time.monotonic() - started < 10
        set_fault(url, metrics="error")
        with pytest.raises(ErrorStatus):
            call(lambda e: e.metrics(url))
        set_fault(url, metrics="hang")
        started = time.monotonic()
        with pytest.raises(TimedOut):
            call(lambda e: e.metrics(url, deadline=0.5))
        assert time.monotonic() - started < 3


def test_a_hung_engine_misses_the_canarys_deadline_while_health_answers(
    tmp_path: Path,
) -> None:
    with sims(1, tmp_path) as (url,):
        set_fault(url, hang=True)
        assert call(lambda e: e.health(url)) == 200
        with pytest.raises(TimedOut):
            call(lambda e: e.canary(url, model=MODEL, deadline=0.5))


def test_no_engine_at_an_address_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Unreachable):
        call(lambda e: e.health(url))


class _Scripted(BaseHTTPRequestHandler):
    """Answers every request with the class's `status` and `body`."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and body in separate writes
    status = 200
    body = b""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self) -> None:
        self.send_response(type(self).status)
        self.send_header("Content-Length", str(len(type(self).body)))
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, format: str, *args: object) -> None:
        pass


# JSON as an engine might garble it: Python's json reads NaN, Infinity and
# 1e999 (an infinite float) as numbers, which no count can be.
_numbers = st.integers() | st.floats() | st.sampled_from(["1e999", "-Infinity", "NaN"])
_json = st.recursive(
    st.none() | st.booleans() | _numbers | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_shaped = st.fixed_dictionaries(
    {},
    optional={
        "usage": st.fixed_dictionaries(
            {}, optional={"prompt_tokens": _json, "completion_tokens": _json}
        )
        | _json,
        "tokens": st.lists(_json, max_size=3) | _json,
        "data": st.lists(st.fixed_dictionaries({}, optional={"id": _json}), max_size=2) | _json,
        "version": _json,
        "error": _json,
    },
)


def _wire(value: object) -> bytes:
    # The special numbers go out bare, as a broken server would write them.
    text = json.dumps(value)
    for bare in ("1e999", "-Infinity", "NaN"):
        text = text.replace(f'"{bare}"', bare)
    return text.encode()


_answers = st.one_of(_shaped.map(_wire), _json.map(_wire), st.binary(max_size=256), st.just(b""))


def _calls(
    url: str,
) -> list[tuple[Callable[[EngineClient], Awaitable[object]], Callable[[object], bool]]]:
    """Each call of the client, and what it must return when it returns."""

    def ints(got: object) -> bool:
        return isinstance(got, list) and all(type(item) is int for item in got)

    def strs(got: object) -> bool:
        return isinstance(got, list) and all(type(item) is str for item in got)

    def usage(got: object) -> bool:
        return isinstance(got, Usage) and ints([got.prompt_tokens, got.completion_tokens])

    return [
        (lambda e: e.health(url), lambda got: type(got) is int),
        (lambda e: e.metrics(url), lambda got: got is not None),
        (lambda e: e.models(url), strs),
        (lambda e: e.version(url), lambda got: type(got) is str),
        (lambda e: e.tokenize(url, model=MODEL, prompt="hi"), ints),
        (lambda e: e.complete(url, path=endpoints.COMPLETIONS, body={}, deadline=5), usage),
        (lambda e: e.canary(url, model=MODEL, deadline=5), lambda got: got is None),
        (lambda e: e.get(url + "/progress", deadline=5), lambda got: got is not None),
    ]


async def _each_returns_its_type_or_an_engine_error(url: str, context: object) -> None:
    async with EngineClient() as engine:
        for ask, typed in _calls(url):
            try:
                got = await ask(engine)
            except EngineError:
                continue
            assert typed(got), (got, context)


def test_whatever_an_engine_answers_each_call_returns_its_type_or_an_engine_error() -> None:
    """The operator's calls meet a hostile or broken engine: each returns what
    it says, or raises an EngineError, never anything else (an OverflowError
    from `int(inf)` escaped `complete` and `tokenize` before)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def each() -> None:
        context = (_Scripted.status, _Scripted.body[:200])
        asyncio.run(_each_returns_its_type_or_an_engine_error(url, context))

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(status=st.sampled_from([200, 200, 200, 400, 404, 500, 503]), body=_answers)
    def answered(status: int, body: bytes) -> None:
        _Scripted.status, _Scripted.body = status, body
        each()

    try:
        answered()
        # Found, and kept pinned: infinite counts, and JSON nested past
        # Python's recursion limit (a RecursionError, not a ValueError).
        for found in (
            b'{"usage": {"prompt_tokens": Infinity}}',
            b'{"tokens": [1e999]}',
            b"[" * 100_000 + b"]" * 100_000,
        ):
            _Scripted.status, _Scripted.body = 200, found
            each()
    finally:
        server.shutdown()
        server.server_close()


def test_whatever_bytes_an_engine_writes_each_call_returns_its_type_or_an_engine_error() -> None:
    """Broken HTTP itself (status lines, header sections, framings, cut
    anywhere), as the router's engine fuzz test writes it."""
    with broken_engine() as engine:

        @settings(max_examples=100, deadline=None, derandomize=True)
        @given(
            status=STATUS_LINES,
            headers=HEADER_LINES,
            body=BODIES,
            cut=st.none() | st.integers(0, 400),
        )
        def answered(status: bytes, headers: list[bytes], body: bytes, cut: int | None) -> None:
            answer = status + b"".join(headers) + b"\r\n" + body
            engine.answer = answer if cut is None else answer[:cut]
            asyncio.run(_each_returns_its_type_or_an_engine_error(engine.url, engine.answer[:200]))

        answered()
