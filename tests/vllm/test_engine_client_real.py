"""shoal's engine client and metrics parser against real vLLM 0.32 (CPU) and
the simulator: the same calls give the same typed answers, and the parsed
metrics move as the engine's own counters do."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from shoal.engine import endpoints
from shoal.engine.client import EngineClient
from shoal.engine.errors import ErrorStatus
from shoal.engine.metrics import MetricsSnapshot
from tests.vllm.conftest import Server

T = TypeVar("T")
Pair = tuple[Server, Server]


def call(ask: Callable[[EngineClient], Awaitable[T]]) -> T:
    async def once() -> T:
        async with EngineClient() as engine:
            return await ask(engine)

    return asyncio.run(once())


def snapshot(server: Server) -> MetricsSnapshot:
    return call(lambda e: e.metrics(server.url))


def test_parsed_metrics_of_both_give_the_same_pool_and_an_idle_engine(both: Pair) -> None:
    real, sim = (snapshot(s) for s in both)
    assert real.kv_pool is not None and real.kv_pool == sim.kv_pool
    assert real.kv_pool.block_size == 128, "vLLM's block size on CPU"
    assert (real.running, real.waiting) == (sim.running, sim.waiting) == (0.0, 0.0)


def test_parsed_metrics_count_a_completion_on_both(both: Pair) -> None:
    body = {"model": "tiny", "prompt": "one two three four", "max_tokens": 3}
    for server in both:
        _count_a_completion(server, body)


def _count_a_completion(server: Server, body: dict[str, object]) -> None:
    before = snapshot(server)
    usage = call(
        lambda e: e.complete(server.url, path=endpoints.COMPLETIONS, body=body, deadline=60)
    )
    rise = snapshot(server).since(before)
    assert rise.requests == 1, server.name
    assert rise.prompt_tokens == usage.prompt_tokens, server.name
    assert rise.generation_tokens == usage.completion_tokens == 3, server.name
    assert rise.prefix_queries == usage.prompt_tokens, server.name
    # Its time to first token, and how much of it was queue and prefill.
    assert rise.ttft_count == rise.queue_count == 1, server.name
    assert rise.prefill_seconds > 0 and rise.queue_seconds >= 0, server.name
    assert rise.queue_seconds + rise.prefill_seconds <= rise.ttft_seconds + 1e-9, server.name


def test_probe_calls_answer_alike_on_both(both: Pair) -> None:
    for server in both:
        _probe_calls_answer(server)


def _probe_calls_answer(server: Server) -> None:
    url = server.url
    assert call(lambda e: e.health(url)) == 200
    assert call(lambda e: e.models(url)) == ["tiny"]
    call(lambda e: e.canary(url, model="tiny", deadline=60))
    tokens = call(lambda e: e.tokenize(url, model="tiny", prompt="hello"))
    assert tokens, server.name
    with pytest.raises(ErrorStatus) as refused:
        call(lambda e: e.canary(url, model="nope", deadline=60))
    assert refused.value.status == 404, server.name
    assert refused.value.error is not None
    assert refused.value.error.type == "NotFoundError", server.name
