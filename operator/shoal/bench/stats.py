"""Summary statistics of a run, under `vllm bench serve`'s field names.

Latencies in milliseconds: TTFT (time to first token), TPOT (time per output
token after the first, per request), ITL (every gap between streamed chunks,
pooled over requests) and E2EL (end to end). Throughputs count completed
requests only, over the run's duration.

`percentile` is the one percentile every shoal benchmark reports (the
harness, the router benchmarks, the warm-up benchmark): `vllm bench serve`'s,
which is `np.percentile` with numpy's default method, "linear": the p-th
percentile of n sorted values sits at rank (n - 1) * p / 100, interpolated
between its two neighbours. So p50 is the median, p100 the maximum, and a
shoal p99 compares with a vLLM one. Written out here, without numpy, so the
router benchmarks need nothing beyond the router's own dependencies.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from shoal.bench.driver import Outcome

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) as `np.percentile(values, p)`; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _describe(name: str, seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    out = {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else math.nan,
        f"median_{name}_ms": percentile(ms, 50),
        f"std_{name}_ms": statistics.pstdev(ms) if ms else math.nan,
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = percentile(ms, p)
    return out


def summarize(outcomes: Sequence[Outcome], *, duration: float) -> dict[str, float]:
    done = [o for o in outcomes if o.ok]
    ttfts = [o.ttft for o in done if o.ttft is not None]
    tpots = [
        (o.latency - o.ttft) / (o.output_tokens - 1)
        for o in done
        if o.latency is not None and o.ttft is not None and o.output_tokens > 1
    ]
    itls = [gap for o in done for gap in o.itls]
    e2els = [o.latency for o in done if o.latency is not None]
    input_tokens = sum(o.prompt_tokens for o in done)
    output_tokens = sum(o.output_tokens for o in done)
    per_second = 1.0 / duration if duration > 0 else math.nan
    summary: dict[str, float] = {
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) * per_second,
        "output_throughput": output_tokens * per_second,
        "total_token_throughput": (input_tokens + output_tokens) * per_second,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        summary.update(_describe(name, values))
    return summary


def by_group(
    outcomes: Sequence[Outcome], *, duration: float, groups: Sequence[str]
) -> dict[str, dict[str, float]]:
    """The same summary for each group of requests (long-tail: short, long)."""
    if len(groups) < 2:
        return {}
    return {
        group: summarize([o for o in outcomes if o.group == group], duration=duration)
        for group in groups
    }


def errors(outcomes: Sequence[Outcome], *, top: int = 5) -> dict[str, int]:
    """The most frequent failure reasons, with counts."""
    counts = Counter(o.error for o in outcomes if not o.ok and o.error)
    return dict(counts.most_common(top))


def routed(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Requests answered by each replica, as the router's response header says."""
    counts = Counter(o.replica for o in outcomes if o.replica)
    return dict(sorted(counts.items()))
