"""/metrics has vLLM 0.32's families, types, HELP text, labels and buckets."""

from __future__ import annotations

import dataclasses

from shoal.sim.config import EngineConfig
from shoal.sim.metrics import EngineMetrics, build_1_2_5_buckets
from shoal.sim.profiles import PROFILES
from tests.sim_fixtures import parse_exposition, text

# The fixtures' server: --max-model-len 2048 --enable-prefix-caching
# --prefix-caching-hash-algo sha256_cbor --kv-cache-memory-bytes 8M --max-num-seqs 8
CONFIG = EngineConfig(
    model="/models/tiny",
    served_model_names=("tiny",),
    profile=PROFILES["tiny-cpu"],
    max_model_len=2048,
    max_num_seqs=8,
    kv_cache_memory_bytes=8 * 1024 * 1024,
    prefix_caching_hash_algo="sha256_cbor",
)


def idle_exposition() -> str:
    metrics = EngineMetrics(model_name="tiny", max_model_len=2048, cache=CONFIG.cache_info())
    # The fixture was taken after one GET /v1/models (the only HTTP series in it).
    metrics.http.observe(
        handler="/v1/models",
        method="GET",
        status=200,
        request_bytes=0,
        response_bytes=450,
        seconds=0.001,
    )
    return metrics.exposition().decode()


def family_order(raw: str) -> list[str]:
    return [line.split()[2] for line in raw.splitlines() if line.startswith("# TYPE ")]


def test_same_families_types_and_help_text_in_the_same_order() -> None:
    ours, recorded = idle_exposition(), text("metrics.idle.txt")
    assert family_order(ours) == family_order(recorded)
    assert parse_exposition(ours)[0] == parse_exposition(recorded)[0]


def test_same_series_and_label_sets_as_the_idle_engine() -> None:
    ours = parse_exposition(idle_exposition())[1]
    recorded = parse_exposition(text("metrics.idle.txt"))[1]
    assert set(ours) == set(recorded)


def test_idle_values_match_except_timestamps_and_process_stats() -> None:
    ours = parse_exposition(idle_exposition())[1]
    recorded = parse_exposition(text("metrics.idle.txt"))[1]
    for key, value in recorded.items():
        name = key[0]
        if name.startswith("vllm:") and not name.endswith("_created"):
            assert ours[key] == value, key


def test_cache_config_info_labels_equal_the_recorded_ones() -> None:
    def info(raw: str) -> frozenset[tuple[str, str]]:
        samples = parse_exposition(raw)[1]
        return next(labels for name, labels in samples if name == "vllm:cache_config_info")

    assert info(idle_exposition()) == info(text("metrics.idle.txt"))
    labels = dict(info(idle_exposition()))
    assert (labels["block_size"], labels["num_gpu_blocks"], labels["kv_cache_size_tokens"]) == (
        "128",
        "64",
        "8192",
    )


def test_cache_config_info_follows_the_flags() -> None:
    config = dataclasses.replace(
        CONFIG, profile=PROFILES["h100-llama3-8b"], kv_cache_memory_bytes=None, block_size=32
    )
    labels = config.cache_info().labels()
    assert labels["block_size"] == "32"
    assert labels["user_specified_block_size"] == "True"
    assert labels["num_gpu_blocks"] == "8192"
    assert labels["kv_cache_size_tokens"] == str(8192 * 32)
    assert labels["enable_prefix_caching"] == "True"


def test_token_buckets_follow_max_model_len_as_vllms_do() -> None:
    assert build_1_2_5_buckets(2048)[-3:] == [500, 1000, 2000]
    assert build_1_2_5_buckets(8192)[-1] == 5000


def test_after_load_series_set_matches_the_recorded_one() -> None:
    """After requests finish, the engine series are the same set as vLLM's
    (histogram buckets, per-reason counters), HTTP series aside."""
    from shoal.sim.kv_cache import BlockPool
    from shoal.sim.scheduler import Scheduler, Sequence

    metrics = EngineMetrics(model_name="tiny", max_model_len=2048, cache=CONFIG.cache_info())
    scheduler = Scheduler(
        pool=BlockPool(num_blocks=64, block_size=128), max_num_seqs=8, max_num_batched_tokens=2048
    )
    tokens = iter(range(10**6))
    scheduler.add(
        Sequence(
            request_id="1",
            token_ids=list(range(20, 920)),
            prompt_len=900,
            max_tokens=4,
            sample=lambda: 20 + next(tokens) % 500,
            arrival=0.0,
        )
    )
    now = 0.0
    while scheduler.has_work:
        now += 0.01
        plan = scheduler.schedule(now)
        outcome = scheduler.complete(plan, now, eos_token_id=1)
        metrics.record_step(plan, outcome, now=now, itls=[0.01] * len(outcome.sampled))

    def engine_series(raw: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
        return {k for k in parse_exposition(raw)[1] if k[0].startswith("vllm:")}

    assert engine_series(metrics.exposition().decode()) == engine_series(
        text("metrics.after_load.txt")
    )
    samples = parse_exposition(metrics.exposition().decode())[1]
    assert (
        samples[("vllm:prompt_tokens_total", frozenset({("engine", "0"), ("model_name", "tiny")}))]
        == 900
    )
    assert (
        samples[
            ("vllm:generation_tokens_total", frozenset({("engine", "0"), ("model_name", "tiny")}))
        ]
        == 4
    )
