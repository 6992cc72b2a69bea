"""What the operator reads from an engine's /metrics: its KV pool (from
`vllm:cache_config_info`) and whether requests are in flight. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class KVPool:
    block_size: int
    gpu_blocks: int

    @property
    def tokens(self) -> int:
        return self.block_size * self.gpu_blocks


@dataclass(frozen=True)
class EngineMetrics:
    running: float
    waiting: float
    kv_pool: KVPool | None

    @property
    def in_flight(self) -> float:
        return self.running + self.waiting


def parse_engine_metrics(text: str) -> EngineMetrics:
    running = waiting = 0.0
    pool: KVPool | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_running":
                running += sample.value
            elif sample.name == "vllm:num_requests_waiting":
                waiting += sample.value
            elif sample.name == "vllm:cache_config_info" and pool is None:
                pool = _kv_pool(sample.labels)
    return EngineMetrics(running=running, waiting=waiting, kv_pool=pool)


def _kv_pool(labels: dict[str, str]) -> KVPool | None:
    try:
        return KVPool(
            block_size=int(labels["block_size"]), gpu_blocks=int(labels["num_gpu_blocks"])
        )
    except (KeyError, ValueError):
        return None  # vLLM writes num_gpu_blocks "None" until the KV cache is allocated
