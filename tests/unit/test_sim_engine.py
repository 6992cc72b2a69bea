"""The engine loop in an event loop, without sockets: outputs, KV and faults."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

import looptime
import pytest

from shoal.engine.metrics import Metric
from shoal.sim.config import EngineConfig
from shoal.sim.engine import Engine, EngineDeadError, RequestStream
from shoal.sim.faults import Faults
from shoal.sim.profiles import PROFILES
from shoal.sim.scheduler import ParentRequest
from tests.sim_fixtures import parse_exposition, value

T = TypeVar("T")

# The fixtures' engine: tiny model, 64 blocks of 128, 8 sequences; 200x time.
TINY = EngineConfig(
    model="/models/tiny",
    served_model_names=("tiny",),
    profile=PROFILES["tiny-cpu"],
    max_model_len=2048,
    max_num_seqs=8,
    kv_cache_memory_bytes=8 * 1024 * 1024,
    time_scale=200.0,
)


def run(
    body: Callable[[Engine], Awaitable[T]], config: EngineConfig = TINY, *, fake_time: bool = False
) -> T:
    """The body against a started engine; with fake_time on an event loop whose
    clock moves only when every task waits (looptime), so what is measured is
    the engine's own time-keeping, not how busy this machine is."""

    async def main() -> T:
        engine = Engine(dataclasses.replace(config, faults=Faults()))
        engine.start()
        try:
            return await asyncio.wait_for(body(engine), 30)
        finally:
            await engine.stop()

    if not fake_time:
        return asyncio.run(main())
    with asyncio.Runner(
        loop_factory=lambda: looptime.new_event_loop(start=0, _enabled=True)
    ) as runner:
        return runner.run(main())


def counter(engine: Engine, name: str) -> float:
    return value(parse_exposition(engine.metrics.exposition().decode())[1], name)


def ttft_parts(engine: Engine) -> tuple[float, float, float]:
    """The sums of the engine's TTFT, queue and prefill times, read by the
    names shoal's parser reads."""
    ttft, queue, prefill = (
        counter(engine, name) for name in (Metric.TTFT_SUM, Metric.QUEUE_SUM, Metric.PREFILL_SUM)
    )
    return ttft, queue, prefill


async def finish(stream: RequestStream) -> list[int]:
    async for _ in stream.deltas():
        pass
    return stream.seq.output_ids


def submit(
    engine: Engine, prompt: list[int], max_tokens: int, seed: int | None = None
) -> RequestStream:
    return engine.submit(prompt_ids=prompt, max_tokens=max_tokens, seed=seed, ignore_eos=True)


def test_kv_config_follows_vllms_flags() -> None:
    assert TINY.resolved_num_gpu_blocks == 64  # 8 MiB / (1 KiB per token x 128)
    assert TINY.cache_info().labels()["kv_cache_size_tokens"] == "8192"


def test_output_depends_on_seed_and_prompt_only() -> None:
    async def body(engine: Engine) -> tuple[list[int], list[int], list[int]]:
        a = submit(engine, list(range(20, 120)), 16, seed=7)
        b = submit(engine, list(range(20, 120)), 16, seed=7)
        c = submit(engine, list(range(20, 120)), 16, seed=8)
        return await finish(a), await finish(b), await finish(c)

    a, b, c = run(body)
    assert a == b != c
    assert len(a) == 16


def test_resent_prompt_hits_whole_blocks_and_kv_usage_returns_to_zero() -> None:
    async def body(engine: Engine) -> tuple[float, float, float]:
        prompt = list(range(3, 603))
        await finish(submit(engine, prompt, 4))
        after_first = counter(engine, "vllm:prefix_cache_hits_total")
        usage_idle = engine.pool.usage()
        await finish(submit(engine, prompt, 4))
        return after_first, usage_idle, counter(engine, "vllm:prefix_cache_hits_total")

    first, usage_idle, second = run(body)
    assert (first, usage_idle, second) == (0.0, 0.0, 512.0)


def test_without_prefix_caching_no_prefix_cache_queries_are_counted() -> None:
    """vLLM records prefix-cache stats only for requests that look the cache
    up (KVCacheManager.record_prefix_cache_stats)."""

    async def body(engine: Engine) -> tuple[float, float]:
        prompt = list(range(3, 603))
        await finish(submit(engine, prompt, 4))
        await finish(submit(engine, prompt, 4))
        return (
            counter(engine, "vllm:prefix_cache_queries_total"),
            counter(engine, "vllm:prefix_cache_hits_total"),
        )

    assert run(body, dataclasses.replace(TINY, enable_prefix_caching=False)) == (0.0, 0.0)


def histogram_sum_count(engine: Engine, name: str) -> tuple[float, float]:
    return counter(engine, f"{name}_sum"), counter(engine, f"{name}_count")


def test_a_requests_n_and_most_generated_tokens_are_recorded_once_all_choices_end() -> None:
    """vLLM's ParentRequest.observe_finished_request: one observation per
    request, of n and of the most tokens any choice generated (not max_tokens)."""
    max_generated = "vllm:request_max_num_generation_tokens"

    async def body(engine: Engine) -> list[tuple[float, float]]:
        seen = []
        # Stops at its first token (stop probability 1): generated 1 of 50.
        await finish(engine.submit(prompt_ids=[5, 6, 7], max_tokens=50, seed=1, ignore_eos=False))
        seen += [histogram_sum_count(engine, max_generated)]
        seen += [histogram_sum_count(engine, "vllm:request_params_n")]
        # Three choices of one prompt; each ends at its own length here.
        parent = ParentRequest(n=3)
        streams = [
            engine.submit(
                prompt_ids=[8, 9], max_tokens=m, seed=2, ignore_eos=True, choice=k, parent=parent
            )
            for k, m in enumerate((3, 5, 4))
        ]
        await finish(streams[0])
        seen += [histogram_sum_count(engine, max_generated)]
        for stream in streams[1:]:
            await finish(stream)
        seen += [histogram_sum_count(engine, max_generated)]
        seen += [histogram_sum_count(engine, "vllm:request_params_n")]
        return seen

    stopping = dataclasses.replace(TINY, stop_probability=1.0)
    assert run(body, stopping) == [(1, 1), (1, 1), (1, 1), (6, 2), (4, 2)]


def test_overload_queues_fills_kv_and_preempts() -> None:
    """The fixtures' load: 24 requests of 900 prompt / 400 output tokens
    against 8 sequence slots and 64 blocks (metrics.loaded.txt)."""

    async def body(engine: Engine) -> tuple[int, float, int, float]:
        streams = [submit(engine, list(range(30 + i, 930 + i)), 400) for i in range(24)]
        max_waiting, max_usage = 0, 0.0
        while any(s.seq.finish_reason is None for s in streams):
            max_waiting = max(max_waiting, len(engine.scheduler.waiting))
            max_usage = max(max_usage, engine.pool.usage())
            await asyncio.sleep(0.001)
        preemptions = int(counter(engine, "vllm:num_preemptions_total"))
        return max_waiting, max_usage, preemptions, engine.pool.usage()

    max_waiting, max_usage, preemptions, usage_after = run(body)
    assert max_waiting >= 16
    assert max_usage > 0.95
    assert preemptions > 0
    assert usage_after == 0.0


def test_hang_stops_progress_and_resuming_finishes_the_request() -> None:
    async def body(engine: Engine) -> tuple[int, int, int]:
        stream = submit(engine, list(range(20, 40)), 2000 - 20)
        await asyncio.sleep(0.05)
        engine.set_hang(True)
        await asyncio.sleep(0.02)
        frozen = stream.seq.num_output
        await asyncio.sleep(0.1)
        still = stream.seq.num_output
        engine.set_hang(False)
        await finish(stream)
        return frozen, still, stream.seq.num_output

    frozen, still, done = run(body)
    assert frozen == still > 0
    assert done == 1980


def test_a_dead_engine_fails_its_requests() -> None:
    async def body(engine: Engine) -> None:
        stream = submit(engine, list(range(20, 40)), 1000)
        await asyncio.sleep(0.01)
        engine.die()
        with pytest.raises(EngineDeadError):
            await finish(stream)
        with pytest.raises(EngineDeadError):
            submit(engine, [20, 21], 2)

    run(body)


def test_step_time_follows_the_profile_and_time_scale() -> None:
    """500 decode steps of one sequence at 20x: the h100 model says 6.08 ms
    each (6 + 0.08), so ~3 s simulated
    in ~150 ms of loop time. On fake time: on the wall clock a busy machine
    stretched the steps past the tolerance (a CI flake); how far real time
    keeps up is the benchmarks' to measure."""
    config = dataclasses.replace(
        TINY, profile=PROFILES["h100-llama3-8b"], kv_cache_memory_bytes=None, time_scale=20.0
    )

    async def body(engine: Engine) -> float:
        stream = submit(engine, [20, 21, 22], 501)
        await finish(stream)
        seq = stream.seq
        assert seq.first_token is not None and seq.last_token is not None
        return (seq.last_token - seq.first_token) / 500

    per_step = run(body, config, fake_time=True)
    assert per_step == pytest.approx(0.00608, rel=1e-3)


def test_ttft_holds_the_frontends_time_and_queue_time_starts_at_the_scheduler() -> None:
    """As vLLM counts them: TTFT from the API server's arrival, queue time
    from when the engine core takes the request. Three prompts of 1,500
    tokens against a 2,048-token step budget: the third waits a step."""
    frontend = TINY.profile.frontend_s
    assert frontend > 0

    async def body(engine: Engine) -> tuple[float, float, float]:
        streams = [
            submit(engine, [20 + (i * 7 + n) % 1000 for n in range(1500)], 2) for i in range(3)
        ]
        for stream in streams:
            await finish(stream)
        return ttft_parts(engine)

    ttft, queue, prefill = run(body, fake_time=True)
    assert queue > 0, "the third prompt waited for the step budget"
    assert ttft == pytest.approx(3 * frontend + queue + prefill)


def test_without_a_frontend_a_request_is_queued_the_moment_it_arrives() -> None:
    """The h100 profile has no frontend time: TTFT is exactly queue plus
    prefill. On the real clock at 200x, the microseconds submit itself takes
    would otherwise open a gap (a CI run saw 0.03 ms a request)."""
    config = dataclasses.replace(
        TINY, profile=PROFILES["h100-llama3-8b"], kv_cache_memory_bytes=None
    )

    async def body(engine: Engine) -> tuple[float | None, float, tuple[float, float, float]]:
        stream = submit(engine, list(range(20, 520)), 2)
        await finish(stream)
        return stream.seq.queued, stream.seq.arrival, ttft_parts(engine)

    queued, arrival, (ttft, queue, prefill) = run(body, config)
    assert queued == arrival
    assert ttft == pytest.approx(queue + prefill, rel=1e-9)


def test_a_slow_reader_still_gets_every_token_and_the_finish() -> None:
    """The engine may finish while the reader is busy with the previous delta."""

    async def body(engine: Engine) -> tuple[int, str | None]:
        stream = submit(engine, list(range(20, 40)), 50)
        received = 0
        async for tokens in stream.deltas():
            received += len(tokens)
            await asyncio.sleep(0.003)  # a slow client: several steps pass
        return received, stream.seq.finish_reason

    assert run(body) == (50, "length")
