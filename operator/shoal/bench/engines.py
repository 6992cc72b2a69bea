"""What the engines themselves counted: `/metrics` read before and after a
run (parsed by `shoal.engine.metrics`), so hit rates and work shares come from the engines'
own books, not from the client's guess.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence

from shoal.engine.client import EngineClient
from shoal.engine.errors import EngineError
from shoal.engine.metrics import MetricsSnapshot, total


async def scrape(
    engine: EngineClient, urls: Sequence[str], *, deadline: float = 5.0
) -> dict[str, MetricsSnapshot | None]:
    """Every engine's metrics, concurrently; None for one that did not answer
    a whole scrape."""

    async def one(url: str) -> MetricsSnapshot | None:
        try:
            return await engine.metrics(url, deadline=deadline)
        except EngineError:
            return None

    results = await asyncio.gather(*(one(url) for url in urls))
    return dict(zip(urls, results, strict=True))


def fleet_report(
    before: Mapping[str, MetricsSnapshot | None], after: Mapping[str, MetricsSnapshot | None]
) -> dict[str, object]:
    """Prefix hit rate, preemptions, where the engines spent the time to
    first token, and each replica's share of the work over a run. A replica
    missing from either read is reported without numbers."""
    deltas = {
        url: a.since(b)
        for url, b in before.items()
        if b is not None and (a := after.get(url)) is not None
    }
    summed = total(deltas.values())
    replicas: list[dict[str, object]] = []
    shares: list[float] = []
    for url in before:
        d = deltas.get(url)
        if d is None:
            replicas.append({"url": url, "scraped": False})
            continue
        if summed.requests:
            shares.append(d.requests / summed.requests)
        replicas.append(
            {
                "url": url,
                "scraped": True,
                "requests": d.requests,
                "request_share": _share(d.requests, summed.requests),
                "prefill_share": _share(d.computed_prompt_tokens, summed.computed_prompt_tokens),
                "prefix_hit_rate": d.hit_rate,
                "preemptions": d.preemptions,
            }
        )
    return {
        "prefix_hit_rate": summed.hit_rate,
        "prefix_cache_queries": summed.prefix_queries,
        "prefix_cache_hits": summed.prefix_hits,
        "computed_prompt_tokens": summed.computed_prompt_tokens,
        "preemptions": summed.preemptions,
        "engine_requests": summed.requests,
        # Busiest replica's share over an even share: 1.0 is perfectly even.
        "request_imbalance": max(shares) * len(shares) if shares else math.nan,
        # Where the time to first token went, on the engines' own clocks
        # (engine time under a simulator's time scale, as the client's is).
        "engine_ttft_ms": summed.mean_ttft * 1000,
        "engine_queue_ms": summed.mean_queue * 1000,
        "engine_prefill_ms": summed.mean_prefill * 1000,
        "replicas": replicas,
    }


def _share(part: float, whole: float) -> float:
    return part / whole if whole else math.nan
