"""The load score the policies compare, from a replica's latest scraped
`/metrics` (parsed by `shoal.engine.metrics`) and the router's own in-flight
count."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.engine.metrics import MetricsSnapshot
from shoal.router.config import RouterConfig


@dataclass(frozen=True)
class Load:
    score: float
    saturated: bool
    requests: float = 0.0  # running + waiting as scraped (0 when unknown)


def load_from_signals(
    signals: MetricsSnapshot | None, *, inflight: int, config: RouterConfig
) -> Load:
    """L = w_kv * kv + w_q * min(waiting / q_norm, 1) + w_r * running / max_num_seqs,
    where the router's own in-flight count stands in for what the last scrape
    has not seen yet. No signals (never scraped): full load."""
    if signals is None:
        return Load(score=1.0, saturated=True)
    seqs = config.max_num_seqs
    running = max(signals.running, min(inflight, seqs))
    waiting = max(signals.waiting, inflight - seqs)
    w = config.weights
    score = (
        w.kv_usage * signals.kv_usage
        + w.queue * min(waiting / config.thresholds.q_norm, 1.0)
        + w.running * min(running / seqs, 1.0)
    )
    saturated = (
        signals.kv_usage >= config.thresholds.saturated_kv_usage
        or waiting >= config.thresholds.q_norm
    )
    return Load(score=score, saturated=saturated, requests=signals.running + signals.waiting)


def load_unknown(*, inflight: int, config: RouterConfig) -> Load:
    """A replica whose metrics cannot be read (the scrape failed, hung or was
    not a vLLM exposition): busy, but still routable. Saturated only by what
    this router itself has in flight there."""
    capacity = config.max_num_seqs + config.thresholds.q_norm
    return Load(score=1.0, saturated=inflight >= capacity, requests=float(inflight))


def load_from_inflight(*, inflight: int, config: RouterConfig) -> Load:
    """When every replica's metrics are stale, route on own in-flight counts
    rather than refuse everything."""
    capacity = config.max_num_seqs + config.thresholds.q_norm
    return Load(score=min(inflight / config.max_num_seqs, 1.0), saturated=inflight >= capacity)
