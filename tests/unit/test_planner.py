"""The capacity planner: the seed's reference table, cases worked out by hand,
and vLLM's start-up rules with their boundaries."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from shoal.planner.architecture import Architecture
from shoal.planner.layout import Layout, parse_layout
from shoal.planner.plan import GPU, plan
from shoal.planner.presets import PRESETS, preset_for_model
from shoal.planner.result import CapacityPlan
from shoal.schema.quantity import GiB

# The seed's machine: 8 x H100 80GB (79.6 GiB as nvidia-smi shows), 0.90, 3 GiB overhead.
H100 = GPU(memory=Fraction("79.6") * GiB, utilization=Fraction("0.90"), overhead=Fraction(3 * GiB))
DEFAULT_H100 = GPU(memory=Fraction(80 * GiB))  # shoal's defaults: 80Gi, 0.92, 3Gi
H200 = GPU(memory=Fraction(140 * GiB), utilization=Fraction("0.90"), overhead=Fraction(3 * GiB))

LLAMA_8B = PRESETS["Llama-3.1-8B"]
LLAMA_70B = PRESETS["Llama-3.1-70B"]
LLAMA_405B = PRESETS["Llama-3.1-405B"]
QWEN_235B = PRESETS["Qwen3-235B-A22B"]
DEEPSEEK_R1 = PRESETS["DeepSeek-R1"]
# A GQA model with 3 query heads per KV head, for the DCP query-heads rule.
SIX_HEADS = Architecture(
    name="six-heads", layers=24, query_heads=6, kv_heads=2, head_size=128, parameters=10**9
)


def rules(result: CapacityPlan) -> list[str]:
    return [refusal.rule for refusal in result.refusals]


@pytest.mark.parametrize(
    ("layout", "weights_gib", "kv_kib", "per_pool", "total"),
    [
        ("tp8", "16.4", 40, 1_368_448, 1_368_448),
        ("tp4pp2", "16.4", 40, 1_368_448, 1_368_448),
        ("tp4dp2", "32.9", 80, 468_770, 937_540),
    ],
)
def test_seed_table_for_llama_70b_on_eight_h100(
    layout: str, weights_gib: str, kv_kib: int, per_pool: int, total: int
) -> None:
    result = plan(LLAMA_70B, H100, layout=parse_layout(layout), max_model_len=8192)
    assert f"{result.weight_bytes_per_gpu / GiB:.1f}" == weights_gib
    assert result.kv_bytes_per_token_per_gpu == kv_kib * 1024
    assert result.kv_tokens_per_replica == per_pool
    assert result.kv_tokens_total == total
    assert result.fits and result.gpus_per_replica * result.replicas == 8


def test_llama_8b_on_one_gpu_by_hand() -> None:
    # weights 8.03e9 x 2 B = 16,060,000,000 B; KV 32 layers x 8 heads x 128 x 2 (K, V)
    # x 2 B = 131,072 B per token; budget 80 GiB x 0.92 - 3 GiB = 70.6 GiB
    # = 75,806,172,774.4 B, minus the weights 59,746,172,774.4 B; / 131,072 = 455,827.12.
    result = plan(LLAMA_8B, DEFAULT_H100, layout=Layout())
    assert result.weight_bytes_per_gpu == 16_060_000_000
    assert result.kv_bytes_per_token_per_gpu == 131_072
    assert result.kv_budget_bytes_per_gpu == 59_746_172_774
    assert result.kv_tokens_per_replica == 455_827
    # At the model's own 131,072-token context: 455,827 / 131,072 = 3.48 requests.
    assert result.max_model_len == 131_072
    assert result.max_concurrency_per_replica == 3.47
    assert result.fits and result.nodes_per_replica == 1


def test_qwen3_235b_at_tp8_holds_each_kv_head_twice_and_dcp2_removes_the_copy() -> None:
    # weights 235e9 x 2 / 8 = 58.75e9 B; budget 79.6 x 0.90 - 3 = 68.64 GiB
    # = 73,701,638,799.36 B, minus weights 14,951,638,799.36 B.
    # TP8 over 4 KV heads: 1 head per rank (each held twice): 94 x 1 x 128 x 2 x 2
    # = 48,128 B per token -> 310,664.04 tokens. DCP 2 keeps half the tokens per rank:
    # 24,064 B -> 621,328.08 tokens.
    tp8 = plan(QWEN_235B, H100, layout=Layout(tensor=8), max_model_len=32768)
    dcp2 = plan(QWEN_235B, H100, layout=Layout(tensor=8, decode_context=2), max_model_len=32768)
    assert tp8.weight_bytes_per_gpu == dcp2.weight_bytes_per_gpu == 58_750_000_000
    assert tp8.kv_bytes_per_token_per_gpu == 48_128
    assert dcp2.kv_bytes_per_token_per_gpu == 24_064
    assert tp8.kv_tokens_per_replica == 310_664
    assert dcp2.kv_tokens_per_replica == 621_328
    assert (tp8.max_concurrency_per_replica, dcp2.max_concurrency_per_replica) == (9.48, 18.96)
    assert tp8.fits and dcp2.fits


def test_tensor_beyond_the_kv_heads_no_longer_shrinks_kv_per_token() -> None:
    tp4 = plan(QWEN_235B, H100, layout=Layout(tensor=4), max_model_len=32768)
    tp8 = plan(QWEN_235B, H100, layout=Layout(tensor=8), max_model_len=32768)
    assert tp4.kv_bytes_per_token_per_gpu == tp8.kv_bytes_per_token_per_gpu


def test_deepseek_r1_mla_caches_one_latent_per_token_on_every_rank() -> None:
    # MLA: one 576-value latent (512 + 64 rope) per token and layer, no K/V pair:
    # 61 x 576 x 2 B = 70,272 B per token on each of the 8 ranks (replicated).
    # FP8 weights: 671e9 / 8 = 83,875,000,000 B; budget 140 x 0.90 - 3 = 123 GiB
    # = 132,070,244,352 B, minus weights 48,195,244,352 B -> 685,838.5 tokens;
    # DCP 8 keeps one copy: 8,784 B per token -> 5,486,708.1 tokens.
    tp8 = plan(DEEPSEEK_R1, H200, layout=Layout(tensor=8))
    dcp8 = plan(DEEPSEEK_R1, H200, layout=Layout(tensor=8, decode_context=8))
    assert tp8.weight_bytes_per_gpu == 83_875_000_000
    assert tp8.kv_bytes_per_token_per_gpu == 70_272
    assert dcp8.kv_bytes_per_token_per_gpu == 8_784
    assert tp8.kv_tokens_per_replica == 685_838
    assert dcp8.kv_tokens_per_replica == 5_486_708
    assert tp8.max_model_len == 163_840
    assert tp8.fits and dcp8.fits


def test_deepseek_r1_does_not_fit_eight_80gb_gpus() -> None:
    result = plan(DEEPSEEK_R1, H100, layout=Layout(tensor=8))
    assert rules(result) == ["weights-fit"]
    assert result.kv_tokens_per_replica == 0
    assert "No available memory for the cache blocks" in result.refusals[0].message


# Decode context parallel: each rule refuses on one side of its boundary and not the other.


def test_dcp_must_divide_tp() -> None:
    refused = plan(QWEN_235B, H100, layout=Layout(tensor=8, decode_context=3), max_model_len=32768)
    assert rules(refused) == ["dcp-divides-tp"]
    assert refused.refusals[0].message.startswith("tp_size=8 must be divisible by dcp_size=3.")
    assert "2 or 4" in refused.refusals[0].message
    assert plan(
        QWEN_235B, H100, layout=Layout(tensor=8, decode_context=2), max_model_len=32768
    ).fits


def test_dcp_needs_tp_above_the_kv_heads() -> None:
    # Llama-3.1-70B has 8 KV heads: TP 8 holds each once, so there is nothing to remove.
    refused = plan(LLAMA_70B, H100, layout=Layout(tensor=8, decode_context=2), max_model_len=8192)
    assert rules(refused) == ["dcp-needs-replicated-kv"]
    assert refused.refusals[0].message.startswith(
        "Decode context parallelism for GQA/MQA requires --tensor-parallel-size (8) to be "
        "greater than the model's total number of KV heads (8)."
    )
    # TP 16 holds each KV head twice: DCP 2 is allowed.
    assert plan(
        LLAMA_70B, H100, layout=Layout(tensor=16, decode_context=2), max_model_len=8192
    ).fits


def test_dcp_at_most_tp_over_kv_heads() -> None:
    # Qwen3-235B-A22B: 4 KV heads, TP 8 -> each held twice -> DCP at most 2.
    assert plan(
        QWEN_235B, H100, layout=Layout(tensor=8, decode_context=2), max_model_len=32768
    ).fits
    refused = plan(QWEN_235B, H100, layout=Layout(tensor=8, decode_context=4), max_model_len=32768)
    assert rules(refused) == ["dcp-max"]
    assert refused.refusals[0].message.startswith(
        "--decode-context-parallel-size (4) exceeds the maximum supported value (2) for "
        "--tensor-parallel-size (8) and 4 model KV heads."
    )


def test_dcp_must_divide_query_heads_per_kv_head() -> None:
    # 6 query heads over 2 KV heads: 3 per KV head; TP 6 holds each KV head 3 times.
    assert plan(SIX_HEADS, H100, layout=Layout(tensor=6, decode_context=3), max_model_len=4096).fits
    refused = plan(SIX_HEADS, H100, layout=Layout(tensor=6, decode_context=2), max_model_len=4096)
    assert rules(refused) == ["dcp-query-heads"]
    assert refused.refusals[0].message.startswith(
        "The model's number of query heads per KV head (3) must be divisible by "
        "--decode-context-parallel-size (2) for GQA/MQA."
    )


def test_mla_skips_the_gqa_dcp_rules() -> None:
    assert plan(DEEPSEEK_R1, H200, layout=Layout(tensor=8, decode_context=8)).fits
    assert rules(plan(DEEPSEEK_R1, H200, layout=Layout(tensor=8, decode_context=16))) == [
        "dcp-divides-tp"
    ]
    # The same heads that the GQA rules refuse pass once the model caches an MLA latent.
    layout = Layout(tensor=6, decode_context=2)
    assert rules(plan(SIX_HEADS, H100, layout=layout, max_model_len=4096)) == ["dcp-query-heads"]
    latent = dataclasses.replace(SIX_HEADS, attention="MLA")
    assert plan(latent, H100, layout=layout, max_model_len=4096).fits


# Heads, layers, nodes and memory.


def test_tensor_must_divide_query_heads() -> None:
    refused = plan(LLAMA_70B, H100, layout=Layout(tensor=3), max_model_len=8192)
    assert rules(refused) == ["attention-heads"]
    assert refused.refusals[0].message.startswith(
        "Total number of attention heads (64) must be divisible by tensor parallel size (3)."
    )
    assert "set the tensor size to 2 or 4" in refused.refusals[0].message


def test_tensor_must_divide_kv_heads_or_be_a_multiple() -> None:
    twelve = Architecture(
        name="twelve", layers=40, query_heads=48, kv_heads=12, head_size=128, parameters=10**10
    )
    assert rules(plan(twelve, H100, layout=Layout(tensor=8), max_model_len=4096)) == ["kv-heads"]
    assert plan(twelve, H100, layout=Layout(tensor=4), max_model_len=4096).fits  # 12 / 4 per rank
    assert plan(twelve, H100, layout=Layout(tensor=24), max_model_len=4096).fits  # each held twice


def test_pipeline_at_most_the_layers() -> None:
    assert plan(LLAMA_8B, H100, layout=Layout(pipeline=32), max_model_len=4096).fits
    assert rules(plan(LLAMA_8B, H100, layout=Layout(pipeline=40), max_model_len=4096)) == [
        "pipeline-layers"
    ]


def test_uneven_pipeline_plans_for_the_busiest_stage() -> None:
    # 126 layers over 4 stages: vLLM gives two stages 32 layers, so plan for 32.
    result = plan(LLAMA_405B, H100, layout=Layout(tensor=8, pipeline=4), max_model_len=8192)
    assert result.kv_bytes_per_token_per_gpu == 32 * 1 * 128 * 2 * 2


def test_a_replica_larger_than_a_node_uses_whole_nodes() -> None:
    two_nodes = plan(
        LLAMA_405B, DEFAULT_H100, layout=Layout(tensor=8, pipeline=2), max_model_len=32768
    )
    assert two_nodes.fits and two_nodes.nodes_per_replica == 2
    refused = plan(LLAMA_70B, H100, layout=Layout(tensor=4, pipeline=3), max_model_len=8192)
    assert rules(refused) == ["node-shape"]


def test_weights_that_fill_the_gpus_are_refused_and_more_gpus_fix_it() -> None:
    tp8 = plan(LLAMA_405B, DEFAULT_H100, layout=Layout(tensor=8), max_model_len=8192)
    assert rules(tp8) == ["weights-fit"]
    assert f"{tp8.weight_bytes_per_gpu / GiB:.1f}" == "94.5"
    assert plan(
        LLAMA_405B, DEFAULT_H100, layout=Layout(tensor=8, pipeline=2), max_model_len=8192
    ).fits


def test_one_full_length_request_must_fit_exactly_at_the_boundary() -> None:
    pool = plan(
        LLAMA_70B, DEFAULT_H100, layout=Layout(tensor=2), max_model_len=1
    ).kv_tokens_per_replica
    at_boundary = plan(LLAMA_70B, DEFAULT_H100, layout=Layout(tensor=2), max_model_len=pool)
    assert at_boundary.fits and at_boundary.max_concurrency_per_replica == 1.0
    over = plan(LLAMA_70B, DEFAULT_H100, layout=Layout(tensor=2), max_model_len=pool + 1)
    assert rules(over) == ["full-length-request"]
    message = over.refusals[0].message
    assert message.startswith(
        f"To serve at least one request with the model's max seq len ({pool + 1}),"
    )
    assert f"Estimated maximum model length is {pool}." in message


def test_max_model_len_beyond_the_models_context_is_refused() -> None:
    qwen_32b = PRESETS["Qwen3-32B"]
    assert plan(qwen_32b, H100, layout=Layout(tensor=2), max_model_len=40960).fits
    refused = plan(qwen_32b, H100, layout=Layout(tensor=2), max_model_len=40961)
    assert rules(refused) == ["max-model-len"]


def test_unknown_context_plans_capacity_without_concurrency() -> None:
    unknown = dataclasses.replace(SIX_HEADS, context_length=None)
    result = plan(unknown, H100, layout=Layout(tensor=2))
    assert result.fits and result.kv_tokens_per_replica > 0
    assert result.max_model_len == 0 and result.max_concurrency_per_replica == 0


def test_layouts_needing_more_nodes_than_given_are_refused() -> None:
    assert plan(LLAMA_70B, H100, layout=parse_layout("tp4dp2"), max_model_len=8192, nodes=1).fits
    refused = plan(LLAMA_70B, H100, layout=parse_layout("tp4dp3"), max_model_len=8192, nodes=1)
    assert rules(refused) == ["cluster-gpus"]


# Layouts and presets.


@pytest.mark.parametrize(
    ("text", "layout", "name"),
    [
        ("tp8", Layout(tensor=8), "TP8"),
        ("tp4pp2", Layout(tensor=4, pipeline=2), "TP4xPP2"),
        ("TP4xDP2", Layout(tensor=4, data=2), "TP4xDP2"),
        ("tp8-dcp2", Layout(tensor=8, decode_context=2), "TP8xDCP2"),
        ("pp2", Layout(pipeline=2), "TP1xPP2"),
    ],
)
def test_layouts_parse_and_name_themselves(text: str, layout: Layout, name: str) -> None:
    assert parse_layout(text) == layout
    assert layout.name == name


@pytest.mark.parametrize("text", ["", "tp", "tp0", "tp8tp4", "tp8 banana", "8"])
def test_bad_layouts_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="layout"):
        parse_layout(text)


@pytest.mark.parametrize(
    ("model", "preset"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("/models/Meta-Llama-3.1-8B-Instruct/", "Llama-3.1-8B"),
        ("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B"),
        ("deepseek-ai/DeepSeek-R1", "DeepSeek-R1"),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", None),  # another context length
        ("mistralai/Mistral-7B-Instruct-v0.3", None),
    ],
)
def test_presets_are_recognised_from_model_ids(model: str, preset: str | None) -> None:
    assert preset_for_model(model) == preset


def test_presets_carry_the_configs_numbers() -> None:
    shapes = {
        name: (a.layers, a.query_heads, a.kv_heads, a.head_size, a.attention)
        for name, a in PRESETS.items()
    }
    assert shapes == {
        "Llama-3.1-8B": (32, 32, 8, 128, "GQA"),
        "Llama-3.1-70B": (80, 64, 8, 128, "GQA"),
        "Llama-3.1-405B": (126, 128, 8, 128, "GQA"),
        "Qwen3-32B": (64, 64, 8, 128, "GQA"),
        "Qwen3-235B-A22B": (94, 64, 4, 128, "GQA"),
        "DeepSeek-R1": (61, 128, 1, 512 + 64, "MLA"),
    }
    assert LLAMA_70B.parameters == 70_600_000_000
