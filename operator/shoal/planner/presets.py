"""Architectures of common models, from their Hugging Face `config.json`.

Parameter counts are given to three significant figures as the model cards
state them (Llama-3.1-70B as 70.6e9, the figure the seed's reference table
uses). DeepSeek-R1 ships FP8 weights; its 671e9 excludes the multi-token
prediction layer, which vLLM loads only for speculative decoding.
"""

from __future__ import annotations

from typing import Literal, get_args

from shoal.planner.architecture import Architecture

PresetName = Literal[
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Llama-3.1-405B",
    "Qwen3-32B",
    "Qwen3-235B-A22B",
    "DeepSeek-R1",
]
PRESET_NAMES: tuple[PresetName, ...] = get_args(PresetName)

PRESETS: dict[PresetName, Architecture] = {
    "Llama-3.1-8B": Architecture(
        name="Llama-3.1-8B",
        layers=32,
        query_heads=32,
        kv_heads=8,
        head_size=128,
        parameters=8_030_000_000,
        context_length=131072,
    ),
    "Llama-3.1-70B": Architecture(
        name="Llama-3.1-70B",
        layers=80,
        query_heads=64,
        kv_heads=8,
        head_size=128,
        parameters=70_600_000_000,
        context_length=131072,
    ),
    "Llama-3.1-405B": Architecture(
        name="Llama-3.1-405B",
        layers=126,
        query_heads=128,
        kv_heads=8,
        head_size=128,
        parameters=406_000_000_000,
        context_length=131072,
    ),
    "Qwen3-32B": Architecture(
        name="Qwen3-32B",
        layers=64,
        query_heads=64,
        kv_heads=8,
        head_size=128,
        parameters=32_800_000_000,
        context_length=40960,
    ),
    "Qwen3-235B-A22B": Architecture(
        name="Qwen3-235B-A22B",
        layers=94,
        query_heads=64,
        kv_heads=4,
        head_size=128,
        parameters=235_000_000_000,
        context_length=40960,
    ),
    # MLA: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 cached values per token
    # and layer, one "KV head" replicated on every TP rank.
    "DeepSeek-R1": Architecture(
        name="DeepSeek-R1",
        layers=61,
        query_heads=128,
        kv_heads=1,
        head_size=576,
        parameters=671_000_000_000,
        dtype="fp8",
        attention="MLA",
        context_length=163840,
    ),
}

# Repository names (the part after the organisation) that share a preset's shape.
# Variants with another context length or dtype (Qwen3 "-2507", "-FP8") are left out.
_REPOSITORIES: dict[PresetName, tuple[str, ...]] = {
    "Llama-3.1-8B": (
        "Llama-3.1-8B",
        "Llama-3.1-8B-Instruct",
        "Meta-Llama-3.1-8B",
        "Meta-Llama-3.1-8B-Instruct",
    ),
    "Llama-3.1-70B": (
        "Llama-3.1-70B",
        "Llama-3.1-70B-Instruct",
        "Meta-Llama-3.1-70B",
        "Meta-Llama-3.1-70B-Instruct",
    ),
    "Llama-3.1-405B": (
        "Llama-3.1-405B",
        "Llama-3.1-405B-Instruct",
        "Meta-Llama-3.1-405B",
        "Meta-Llama-3.1-405B-Instruct",
    ),
    "Qwen3-32B": ("Qwen3-32B",),
    "Qwen3-235B-A22B": ("Qwen3-235B-A22B",),
    "DeepSeek-R1": ("DeepSeek-R1", "DeepSeek-R1-0528"),
}
_BY_REPOSITORY = {
    repository.lower(): preset for preset, names in _REPOSITORIES.items() for repository in names
}
# Public for the CRD's CEL rules, which recognise the same names at admission.
REPOSITORY_PRESETS: dict[str, PresetName] = dict(_BY_REPOSITORY)


def preset_for_model(model: str) -> PresetName | None:
    """The preset of a Hugging Face id or a local path ending in the repository's name."""
    repository = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return _BY_REPOSITORY.get(repository)
