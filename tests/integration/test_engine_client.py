"""The control plane's engine client against simulated engines: each call's
answer typed, each failure told apart (no answer, no answer in time, an
error answer with vLLM's error body, a scrape that is not vLLM's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from shoal.engine import endpoints
from shoal.engine.client import EngineClient
from shoal.engine.errors import BadMetrics, ErrorStatus, TimedOut, Unreachable
from tests.integration.procs import MODEL, free_port, set_fault, sims

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
