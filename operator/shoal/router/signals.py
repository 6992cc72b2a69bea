"""Engine signals read from a replica's `/metrics` (vLLM's names), and the
load score the policies compare."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from shoal.router.config import RouterConfig

# Sample names as prometheus_client's parser yields them (counters keep `_total`).
_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}
_OLD_KV = "vllm:gpu_cache_usage_perc"  # before vLLM 0.10


@dataclass(frozen=True)
class EngineSignals:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    generation_tokens: float = 0.0
    block_size: int | None = None
    num_blocks: int | None = None


_WANTED = (
    *_GAUGES,
    _OLD_KV,
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:generation_tokens",
    "vllm:cache_config_info",
)


def relevant_lines(text: str) -> str:
    """Only the families the router reads. An engine exposes hundreds of lines
    (histogram buckets mostly); parsing them all every 250 ms for a large fleet
    would cost the router a core."""
    keep = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") else line
        if name.startswith(_WANTED):
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> EngineSignals:
    """Sum over engines (one per data-parallel rank in one process)."""
    text = relevant_lines(text)
    values: dict[str, float] = {}
    old_kv: float | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in _GAUGES:
                key = _GAUGES[name]
                values[key] = values.get(key, 0.0) + sample.value
            elif name == _OLD_KV:
                old_kv = (old_kv or 0.0) + sample.value
            elif name == "vllm:prefix_cache_queries_total":
                values["prefix_queries"] = values.get("prefix_queries", 0.0) + sample.value
            elif name == "vllm:prefix_cache_hits_total":
                values["prefix_hits"] = values.get("prefix_hits", 0.0) + sample.value
            elif name == "vllm:generation_tokens_total":
                values["generation_tokens"] = values.get("generation_tokens", 0.0) + sample.value
            elif name == "vllm:cache_config_info":
                block_size = _int_label(sample.labels.get("block_size"))
                num_blocks = _int_label(sample.labels.get("num_gpu_blocks"))
    if "kv_usage" not in values and old_kv is not None:
        values["kv_usage"] = old_kv
    return EngineSignals(block_size=block_size, num_blocks=num_blocks, **values)


def _int_label(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Load:
    score: float
    saturated: bool
    requests: float = 0.0  # running + waiting as scraped (0 when unknown)


def load_from_signals(
    signals: EngineSignals | None, *, inflight: int, config: RouterConfig
) -> Load:
    """L = w_kv * kv + w_q * min(waiting / q_norm, 1) + w_r * running / max_num_seqs,
    where the router's own in-flight count stands in for what the last scrape
    has not seen yet. No signals (stale or failed scrape): full load."""
    if signals is None:
        return Load(score=1.0, saturated=True)
    seqs = config.max_num_seqs
    running = max(signals.running, min(inflight, seqs))
    waiting = max(signals.waiting, inflight - seqs)
    w = config.weights
    score = (
        w.kv * signals.kv_usage
        + w.queue * min(waiting / config.q_norm, 1.0)
        + w.running * min(running / seqs, 1.0)
    )
    saturated = signals.kv_usage >= config.saturation_kv or waiting >= config.q_norm
    return Load(score=score, saturated=saturated, requests=signals.running + signals.waiting)


def load_from_inflight(*, inflight: int, config: RouterConfig) -> Load:
    """When every replica's metrics are stale, route on own in-flight counts
    rather than refuse everything."""
    capacity = config.max_num_seqs + config.q_norm
    return Load(score=min(inflight / config.max_num_seqs, 1.0), saturated=inflight >= capacity)
