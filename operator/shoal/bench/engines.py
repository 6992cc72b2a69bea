"""What the engines themselves counted: `/metrics` read before and after a
run (vLLM's names), so hit rates and work shares come from the engines'
own books, not from the client's guess.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Sample name -> field; each summed over the engine's label sets.
_SAMPLES = {
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:request_success_total": "requests",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}
# A sample line starts with its name and then `{` or a space.
_SAMPLE_PREFIXES = tuple(f"{name}{end}" for name in _SAMPLES for end in ("{", " "))


@dataclass(frozen=True)
class EngineCounters:
    prefix_queries: float = 0.0  # prompt tokens looked up in the prefix cache
    prefix_hits: float = 0.0  # of which found there
    preemptions: float = 0.0
    requests: float = 0.0  # finished, any reason
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    # Gauges (a delta of these means nothing; the live view shows them as is).
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0

    def minus(self, earlier: EngineCounters) -> EngineCounters:
        return EngineCounters(
            **{
                f.name: getattr(self, f.name) - getattr(earlier, f.name)
                for f in fields(self)
                if f.name not in ("running", "waiting", "kv_usage")
            },
            running=self.running,
            waiting=self.waiting,
            kv_usage=self.kv_usage,
        )

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else math.nan

    @property
    def computed_prompt_tokens(self) -> float:
        """Prompt tokens the engine had to prefill (not found in its cache)."""
        return self.prefix_queries - self.prefix_hits


def parse_engine_metrics(text: str) -> EngineCounters:
    """Only the wanted samples are parsed: an engine exposes hundreds of lines
    (histogram buckets mostly), and the live view reads every engine twice a
    second from the process that times the requests."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_SAMPLE_PREFIXES))
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            key = _SAMPLES.get(sample.name)
            if key is not None:
                values[key] = values.get(key, 0.0) + sample.value
    return EngineCounters(**values)


async def scrape(
    session: aiohttp.ClientSession, urls: Sequence[str], *, limit_seconds: float = 5.0
) -> dict[str, EngineCounters | None]:
    """Every engine's counters, concurrently; None for one that did not answer."""

    async def one(url: str) -> EngineCounters | None:
        try:
            async with session.get(
                url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=limit_seconds)
            ) as response:
                if response.status != 200:
                    return None
                return parse_engine_metrics(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    results = await asyncio.gather(*(one(url) for url in urls))
    return dict(zip(urls, results, strict=True))


def fleet_report(
    before: Mapping[str, EngineCounters | None], after: Mapping[str, EngineCounters | None]
) -> dict[str, object]:
    """Prefix hit rate, preemptions and each replica's share of the work over
    a run. A replica missing from either read is reported without numbers."""
    deltas = {
        url: a.minus(b)
        for url, b in before.items()
        if b is not None and (a := after.get(url)) is not None
    }
    total = EngineCounters(
        **{f.name: sum(getattr(d, f.name) for d in deltas.values()) for f in fields(EngineCounters)}
    )
    replicas: list[dict[str, object]] = []
    shares: list[float] = []
    for url in before:
        d = deltas.get(url)
        if d is None:
            replicas.append({"url": url, "scraped": False})
            continue
        if total.requests:
            shares.append(d.requests / total.requests)
        replicas.append(
            {
                "url": url,
                "scraped": True,
                "requests": d.requests,
                "request_share": _share(d.requests, total.requests),
                "prefill_share": _share(d.computed_prompt_tokens, total.computed_prompt_tokens),
                "prefix_hit_rate": d.hit_rate,
                "preemptions": d.preemptions,
            }
        )
    return {
        "prefix_hit_rate": total.hit_rate,
        "prefix_cache_queries": total.prefix_queries,
        "prefix_cache_hits": total.prefix_hits,
        "computed_prompt_tokens": total.computed_prompt_tokens,
        "preemptions": total.preemptions,
        "engine_requests": total.requests,
        # Busiest replica's share over an even share: 1.0 is perfectly even.
        "request_imbalance": max(shares) * len(shares) if shares else math.nan,
        "replicas": replicas,
    }


def _share(part: float, whole: float) -> float:
    return part / whole if whole else math.nan
