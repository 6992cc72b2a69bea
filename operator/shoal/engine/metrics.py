"""vLLM's metric names and the one parser of its `/metrics`. Pure.

`parse` turns a scrape into one `MetricsSnapshot` snapshot: load (running,
waiting, KV usage), the counters (prefix-cache queries and hits, preemptions,
finished requests, prompt and generated tokens) and the KV pool from
`vllm:cache_config_info`. Values are summed over the engines of one server
(one per data-parallel rank, label `engine`); KV usage, a share of each
engine's own pool, is their mean.

A scrape that is not a whole vLLM exposition raises `BadMetrics`: text that
does not end its last line (cut short), whose lines read here are not sample
lines of the text format, or that lacks the load gauges every vLLM exposes.
A router reading such a scrape as zeros would send everything to a broken
engine.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from prometheus_client.parser import text_string_to_metric_families

from shoal.engine.errors import BadMetrics


class Metric(StrEnum):
    """Sample names as vLLM exposes them (prometheus_client writes counters
    with `_total`)."""

    RUNNING = "vllm:num_requests_running"
    WAITING = "vllm:num_requests_waiting"
    KV_USAGE = "vllm:kv_cache_usage_perc"
    PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
    PREFIX_HITS = "vllm:prefix_cache_hits_total"
    PREEMPTIONS = "vllm:num_preemptions_total"
    REQUEST_SUCCESS = "vllm:request_success_total"  # by finished_reason
    PROMPT_TOKENS = "vllm:prompt_tokens_total"
    GENERATION_TOKENS = "vllm:generation_tokens_total"
    # Engine steps: its histogram of tokens per step counts every step, one
    # that only moves a long prompt's prefill on included.
    STEPS = "vllm:iteration_tokens_total_count"
    CACHE_CONFIG = "vllm:cache_config_info"  # labels only: block_size, num_gpu_blocks, ...
    # Histograms' sums and counts, in seconds: where the time to first token
    # went. TTFT is observed at the first token; queue (waiting to be
    # scheduled) and prefill (scheduled to first token) when a request ends.
    TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
    TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
    QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
    QUEUE_COUNT = "vllm:request_queue_time_seconds_count"
    PREFILL_SUM = "vllm:request_prefill_time_seconds_sum"
    # Deprecated in vLLM 0.10 for the names above (vllm#18354), removed later;
    # read when the current name is absent.
    GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
    GPU_PREFIX_QUERIES = "vllm:gpu_prefix_cache_queries_total"
    GPU_PREFIX_HITS = "vllm:gpu_prefix_cache_hits_total"


# Snapshot field -> its names, current first.
_FIELDS: dict[str, tuple[Metric, ...]] = {
    "running": (Metric.RUNNING,),
    "waiting": (Metric.WAITING,),
    "kv_usage": (Metric.KV_USAGE, Metric.GPU_CACHE_USAGE),
    "prefix_queries": (Metric.PREFIX_QUERIES, Metric.GPU_PREFIX_QUERIES),
    "prefix_hits": (Metric.PREFIX_HITS, Metric.GPU_PREFIX_HITS),
    "preemptions": (Metric.PREEMPTIONS,),
    "requests": (Metric.REQUEST_SUCCESS,),
    "prompt_tokens": (Metric.PROMPT_TOKENS,),
    "generation_tokens": (Metric.GENERATION_TOKENS,),
    "steps": (Metric.STEPS,),
    "ttft_seconds": (Metric.TTFT_SUM,),
    "ttft_count": (Metric.TTFT_COUNT,),
    "queue_seconds": (Metric.QUEUE_SUM,),
    "queue_count": (Metric.QUEUE_COUNT,),
    "prefill_seconds": (Metric.PREFILL_SUM,),
}
_MEAN = frozenset({"kv_usage"})
# Every vLLM version shoal supports exposes these; a scrape without them is
# not a whole vLLM scrape.
_REQUIRED = ("running", "waiting", "kv_usage")
GAUGES = frozenset({"running", "waiting", "kv_usage"})
COUNTERS = tuple(name for name in _FIELDS if name not in GAUGES)

_NAMES = frozenset(Metric)
_CACHE_CONFIG = (f"{Metric.CACHE_CONFIG}{{", f"{Metric.CACHE_CONFIG} ")
# A line's first _KEY characters, looked up in a set, pass over the hundreds
# of other lines (histogram buckets mostly) at a fraction of the cost of
# matching each against every wanted name.
_KEY = min(len(name) for name in Metric)
_KEYS = frozenset(name[:_KEY] for name in Metric)
# A sample line of the text format: name, labels, value, optional timestamp.
# (prometheus_client's parser reads the same, at about 18 us a line.)
_SAMPLE = re.compile(
    r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'(?:\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,(?=[a-zA-Z_])|,?(?=\})))*\})?'
    r"[ \t]+(?P<value>\S+)(?:[ \t]+-?[0-9]+)?[ \t]*"
)


@dataclass(frozen=True)
class KVPool:
    block_size: int
    gpu_blocks: int

    @property
    def tokens(self) -> int:
        return self.block_size * self.gpu_blocks


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape of one engine server."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1; counts only blocks held by running requests
    prefix_queries: float = 0.0  # prompt tokens looked up in the prefix cache
    prefix_hits: float = 0.0  # of which found there (whole blocks)
    preemptions: float = 0.0
    requests: float = 0.0  # finished, any reason
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    steps: float = 0.0
    ttft_seconds: float = 0.0  # arrival to first token, summed over ttft_count requests
    ttft_count: float = 0.0
    queue_seconds: float = 0.0  # queued to first scheduled, summed over queue_count ended ones
    queue_count: float = 0.0
    prefill_seconds: float = 0.0  # first scheduled to first token, over the same ones
    block_size: int | None = None
    gpu_blocks: int | None = None  # None until vLLM has allocated the KV cache

    @property
    def in_flight(self) -> float:
        return self.running + self.waiting

    @property
    def progress(self) -> float:
        """A counter that moves while the engine works: tokens generated plus
        steps taken (a long prompt's prefill takes steps and generates
        nothing, while what waits behind it gets no answer)."""
        return self.generation_tokens + self.steps

    @property
    def kv_pool(self) -> KVPool | None:
        if self.block_size is None or self.gpu_blocks is None:
            return None
        return KVPool(block_size=self.block_size, gpu_blocks=self.gpu_blocks)

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else math.nan

    @property
    def mean_ttft(self) -> float:
        """Seconds from arrival to first token, on the engine's own clock."""
        return self.ttft_seconds / self.ttft_count if self.ttft_count else math.nan

    @property
    def mean_queue(self) -> float:
        """Seconds a request waited to be scheduled (its share of the TTFT
        spent behind other requests' steps)."""
        return self.queue_seconds / self.queue_count if self.queue_count else math.nan

    @property
    def mean_prefill(self) -> float:
        """Seconds from first scheduled to first token: its own prefill, and
        whatever else ran in those steps."""
        return self.prefill_seconds / self.queue_count if self.queue_count else math.nan

    @property
    def computed_prompt_tokens(self) -> float:
        """Prompt tokens the engine had to prefill (not found in its cache)."""
        return self.prefix_queries - self.prefix_hits

    def since(self, earlier: MetricsSnapshot) -> MetricsSnapshot:
        """The counters' rise since `earlier`; gauges and the pool as now (a
        difference of gauges means nothing)."""
        return replace(
            self, **{name: getattr(self, name) - getattr(earlier, name) for name in COUNTERS}
        )


def total(snapshots: Iterable[MetricsSnapshot]) -> MetricsSnapshot:
    """Counters and gauges summed over several engine servers (no pool)."""
    found = list(snapshots)
    return MetricsSnapshot(**{name: sum(getattr(s, name) for s in found) for name in _FIELDS})


def parse(text: str) -> MetricsSnapshot:
    """The snapshot of one scrape; BadMetrics when it is not a whole vLLM scrape."""
    if not text.endswith("\n"):
        # The text format ends every line, the last one too.
        raise BadMetrics("the scrape is cut short (its last line is not ended)")
    # Only the sample lines of the metrics read here are parsed. An engine
    # exposes hundreds of lines; the router parses every engine's every
    # 250 ms, so a scrape's cost is mostly the pass over the lines it skips.
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    config: str | None = None
    for line in text.splitlines():
        if line[:_KEY] not in _KEYS:
            continue
        # The sample's name ends at its labels' `{`, or at the space before
        # its value. (Histogram buckets share their _sum's first characters.)
        end = line.find("{")
        if line[: end if end > 0 else line.find(" ")] not in _NAMES:
            continue
        if line.startswith(_CACHE_CONFIG):
            if config is None:  # one per engine, alike but for the engine label
                config = line
            continue
        sample = _SAMPLE.fullmatch(line)
        if sample is None:
            raise BadMetrics(f"not Prometheus text: not a sample line: {line[:120]!r}")
        try:
            value = float(sample["value"])
        except ValueError as error:
            raise BadMetrics(f"not Prometheus text: {error}") from error
        name = sample["name"]
        if value < 0:
            # No count or load read here can be: weighed, a negative load
            # would draw every request to the engine that reports it.
            raise BadMetrics(f"{name} is {sample['value']}: negative, not a load or count")
        sums[name] = sums.get(name, 0.0) + value
        if not math.isfinite(sums[name]):
            # Well-formed, but no load or count (a NaN, an infinity, or values that
            # sum past the largest float): a NaN orders against nothing.
            raise BadMetrics(f"{name} is {sample['value']}, not a number the router can weigh")
        counts[name] = counts.get(name, 0) + 1
    try:
        block_size, gpu_blocks = _pool(config) if config is not None else (None, None)
    except (ValueError, IndexError, KeyError, TypeError) as error:
        raise BadMetrics(f"not Prometheus text: {error}") from error
    values: dict[str, float] = {}
    for field, names in _FIELDS.items():
        name = next((n for n in names if n in sums), None)
        if name is not None:
            values[field] = sums[name] / counts[name] if field in _MEAN else sums[name]
    missing = [_FIELDS[f][0].value for f in _REQUIRED if f not in values]
    if missing:
        raise BadMetrics(f"not a whole vLLM scrape: no {', '.join(missing)}")
    return MetricsSnapshot(**values, block_size=block_size, gpu_blocks=gpu_blocks)


@functools.lru_cache(maxsize=1024)
def _pool(line: str) -> tuple[int | None, int | None]:
    """Block size and GPU blocks of a cache_config_info line. Cached: the line
    is the same every scrape (until the pool is allocated) and its forty
    labels cost more to parse than every other line read here."""
    labels: dict[str, str] = {}
    for family in text_string_to_metric_families(line + "\n"):
        for sample in family.samples:
            labels = sample.labels
    return _count(labels.get("block_size")), _count(labels.get("num_gpu_blocks"))


def _count(label: str | None) -> int | None:
    """A positive integer label; vLLM writes num_gpu_blocks "None" until the
    KV cache is allocated."""
    try:
        value = int(label) if label is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None
