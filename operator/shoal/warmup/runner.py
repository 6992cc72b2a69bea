"""Warm one engine and verify it, over its OpenAI API and `/metrics`.

Send every prompt with `max_tokens: 1` (bounded concurrency, so warm-up does
not starve the engine), then replay a sample one at a time and compare the
rise of `vllm:prefix_cache_hits_total` with the hits a fully cached prompt
would give. KV usage cannot tell: real vLLM reads 0% on a warm idle engine.
If the ratio falls short (a set larger than the cache evicts its first
prompts), warm again until the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from shoal.engine import endpoints
from shoal.engine.client import EngineClient
from shoal.engine.errors import BadAnswer, EngineError, ErrorStatus
from shoal.engine.metrics import Metric
from shoal.warmup.prompts import Prompt
from shoal.warmup.verify import Verdict, expected_hits, hit_ratio, replay_sample

T = TypeVar("T")

# Between rounds that could not reach the engine (all within the deadline).
RETRY_SECONDS = 0.5


@dataclass(frozen=True)
class WarmupResult:
    verdict: Verdict
    prompts_sent: int
    hit_ratio: float | None
    duration_seconds: float
    rounds: int
    detail: str = ""

    @property
    def message(self) -> str:
        ratio = "n/a" if self.hit_ratio is None else f"{self.hit_ratio:.2f}"
        text = (
            f"{self.verdict}: {self.prompts_sent} prompts sent in {self.rounds} round(s), "
            f"hit ratio {ratio}, {self.duration_seconds:.1f}s"
        )
        return f"{text}; {self.detail}" if self.detail else text


async def _served_model(engine: EngineClient, endpoint: str, deadline: float) -> str:
    models = await engine.models(endpoint, deadline=deadline)
    if not models:
        raise BadAnswer(f"{endpoint}{endpoints.MODELS} lists no model")
    return models[0]


async def _metrics(
    engine: EngineClient, endpoint: str, deadline: float
) -> tuple[float, int | None]:
    metrics = await engine.metrics(endpoint, deadline=deadline)
    return metrics.prefix_hits, metrics.block_size


class Refused(Exception):
    """The engine refused one prompt as a bad request (too long for
    max_model_len, a chat template that rejects its messages): that prompt
    is skipped, not the warm-up."""


async def _send(
    engine: EngineClient, endpoint: str, *, model: str, prompt: Prompt, deadline: float
) -> int:
    path, body = prompt.request(model)
    try:
        usage = await engine.complete(endpoint, path=path, body=body, deadline=deadline)
    except ErrorStatus as error:
        if 400 <= error.status < 500 and error.status not in (404, 408, 429):
            raise Refused(str(error)) from error
        raise
    return usage.prompt_tokens


async def _all(sends: Iterable[Awaitable[T]]) -> list[T]:
    """Every send's result, as gather gives them; when one fails, the others
    are cancelled (and waited for) before its error is raised: left running,
    they went on sending into the next round (their hits counted in its
    replay) or past the warm-up's end, at an address another pod may have."""
    tasks = [asyncio.ensure_future(send) for send in sends]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def warm(
    endpoint: str,
    prompts: Sequence[Prompt],
    *,
    engine: EngineClient,
    model: str | None = None,
    min_hit_ratio: float = 0.9,
    timeout_seconds: float = 300.0,
    concurrency: int = 4,
    sample_size: int = 8,
    request_timeout_seconds: float = 60.0,
) -> WarmupResult:
    """Warm the engine at `endpoint` over `engine` (the caller's client):
    every engine call under request_timeout_seconds, the whole warm-up under
    timeout_seconds."""
    started = time.monotonic()
    endpoint = endpoint.rstrip("/")
    sent = 0
    rounds = 0
    ratio: float | None = None

    refusals: list[str] = []

    def result(verdict: Verdict, detail: str = "") -> WarmupResult:
        if refusals:
            refused = f"{len(refusals)} prompt(s) refused by the engine, e.g. {refusals[0]}"
            detail = f"{detail}; {refused}" if detail else refused
        return WarmupResult(verdict, sent, ratio, time.monotonic() - started, rounds, detail)

    failing: str | None = None  # why the last round could not finish
    try:
        async with asyncio.timeout(timeout_seconds):
            limit = asyncio.Semaphore(concurrency)

            async def send(prompt: Prompt) -> int | None:
                nonlocal sent
                async with limit:
                    assert model is not None
                    try:
                        tokens = await _send(
                            engine,
                            endpoint,
                            model=model,
                            prompt=prompt,
                            deadline=request_timeout_seconds,
                        )
                    except Refused as refused:
                        if rounds == 1:
                            refusals.append(str(refused))
                        return None
                    sent += 1
                    return tokens

            while True:
                rounds += 1
                try:
                    model = model or await _served_model(engine, endpoint, request_timeout_seconds)
                    tokens = await _all(send(p) for p in prompts)
                    hits_before, block_size = await _metrics(
                        engine, endpoint, request_timeout_seconds
                    )
                    if block_size is None:
                        return result(Verdict.UNREACHABLE, f"no {Metric.CACHE_CONFIG} block size")
                    accepted = [i for i, t in enumerate(tokens) if t is not None]
                    sample = [accepted[j] for j in replay_sample(len(accepted), size=sample_size)]
                    expected = [expected_hits(tokens[i] or 0, block_size) for i in sample]
                    if sum(expected) == 0:
                        return result(
                            Verdict.NOTHING_TO_VERIFY,
                            f"no sampled prompt is longer than one {block_size}-token block",
                        )
                    # One at a time: a replay must not hit blocks another replay
                    # is computing in the same step.
                    for i in sample:
                        await send(prompts[i])
                    hits_after, _ = await _metrics(engine, endpoint, request_timeout_seconds)
                except EngineError as error:
                    # No answer, or a failing one, in the round or its replay:
                    # the engine restarting, a stopping process still at its
                    # address, a blip. Again until the deadline (one error
                    # admitted a cold engine at once, or held it for good).
                    failing = str(error) or type(error).__name__
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                failing = None
                ratio = hit_ratio(hits_after - hits_before, expected)
                if ratio is not None and ratio >= min_hit_ratio:
                    return result(Verdict.WARM)
    except TimeoutError:
        why = f"deadline of {timeout_seconds:.0f}s passed"
        if failing is not None:
            return result(Verdict.UNREACHABLE, f"{why}; the engine last failed: {failing}")
        return result(Verdict.TIMEOUT if ratio is None else Verdict.NOT_WARM, why)
