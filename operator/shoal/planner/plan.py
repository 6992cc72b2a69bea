"""The planner's arithmetic and vLLM's start-up rules, as pure functions.

The arithmetic is the seed article's: GiB = 2^30; weights per GPU =
parameters x bytes per parameter / (TP x PP); KV bytes per token per GPU =
layers per stage x max(KV heads / TP, 1) x head size x 2 (K and V) x bytes per
element, divided by DCP (each DCP rank keeps 1/DCP of the tokens, which removes
the copies TP made when it exceeds the KV heads); pool tokens = floor((memory x
utilisation - weights - overhead) / KV bytes per token). Exact fractions, so
79.6 GiB x 0.90 is what it says. vLLM rounds its pool down to whole blocks;
this does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import ceil, floor

from shoal.planner.architecture import Architecture
from shoal.planner.layout import Layout
from shoal.planner.result import CapacityPlan, Refusal
from shoal.schema.quantity import GiB

ROUNDING_NOTE = (
    "Token counts are before rounding: vLLM rounds each KV pool down to whole blocks "
    "(16 tokens by default), so its logged GPU KV cache size is slightly lower."
)


@dataclass(frozen=True)
class GPU:
    """One GPU as the planner sees it (memory as nvidia-smi's memory.total)."""

    memory: Fraction
    per_node: int = 8
    utilization: Fraction = Fraction(92, 100)  # vLLM's --gpu-memory-utilization default
    overhead: Fraction = Fraction(3 * GiB)  # activations, CUDA graphs, NCCL buffers


def weight_bytes_per_gpu(arch: Architecture, layout: Layout) -> Fraction:
    return arch.weight_bytes / (layout.tensor * layout.pipeline)


def kv_bytes_per_token_per_gpu(arch: Architecture, layout: Layout) -> Fraction:
    # The busiest stage: when PP does not divide the layers, vLLM gives some stages one
    # more (get_pp_indices), and the smallest per-GPU pool bounds the replica's.
    layers = ceil(arch.layers / layout.pipeline)
    kv_heads_per_rank = max(ceil(arch.kv_heads / layout.tensor), 1)
    full = layers * kv_heads_per_rank * arch.head_size * arch.kv_tensors * arch.kv_element_bytes
    return Fraction(full, layout.decode_context)


def plan(
    arch: Architecture,
    gpu: GPU,
    *,
    layout: Layout,
    max_model_len: int | None = None,
    nodes: int | None = None,
) -> CapacityPlan:
    """Capacity of `layout` for `arch` on `gpu`, and every rule that refuses it.
    With neither max_model_len nor the model's context length, concurrency and the
    full-length check are left out (max_model_len 0): vLLM will read the context
    from the model's config.json, which the planner has not seen."""
    model_len = max_model_len or arch.context_length or 0
    refusals = layout_refusals(arch, layout, gpus_per_node=gpu.per_node)
    refusals += _context_refusals(arch, model_len)
    weights = weight_bytes_per_gpu(arch, layout)
    kv_per_token = kv_bytes_per_token_per_gpu(arch, layout)
    usable = gpu.memory * gpu.utilization - gpu.overhead
    budget = max(usable - weights, Fraction(0))
    tokens = floor(budget / kv_per_token)
    if budget == 0:
        refusals.append(_no_memory(weights, usable))
    elif model_len and tokens < model_len:
        refusals.append(
            _full_length(
                model_len=model_len,
                kv_per_token=kv_per_token,
                budget=budget,
                tokens=tokens,
                replicated=max(layout.tensor // arch.kv_heads, 1) > layout.decode_context,
            )
        )
    if nodes is not None:
        refusals += _cluster_refusals(layout, per_node=gpu.per_node, nodes=nodes)
    per_replica = Fraction(tokens, model_len) if model_len else Fraction(0)
    return CapacityPlan(
        layout=layout.name,
        tensor=layout.tensor,
        pipeline=layout.pipeline,
        decode_context=layout.decode_context,
        replicas=layout.data,
        gpus_per_replica=layout.gpus_per_replica,
        nodes_per_replica=layout.nodes_per_replica(gpu.per_node),
        weight_bytes_per_gpu=ceil(weights),
        kv_bytes_per_token_per_gpu=ceil(kv_per_token),
        kv_budget_bytes_per_gpu=floor(budget),
        kv_tokens_per_replica=tokens,
        kv_tokens_total=tokens * layout.data,
        max_model_len=model_len,
        max_concurrency_per_replica=floor(per_replica * 100) / 100,
        fits=not refusals,
        refusals=refusals,
    )


def layout_refusals(
    arch: Architecture | None, layout: Layout, *, gpus_per_node: int
) -> list[Refusal]:
    """vLLM's rules on heads, layers and DCP, and the node shape of one replica.
    Without an architecture only the rules that need none are checked."""
    tp, dcp = layout.tensor, layout.decode_context
    refusals = _head_refusals(arch, tp) if arch else []
    if arch and layout.pipeline > arch.layers:
        refusals.append(
            Refusal(
                rule="pipeline-layers",
                message=f"--pipeline-parallel-size ({layout.pipeline}) exceeds the model's "
                f"{arch.layers} layers: every stage needs at least one. "
                f"Fix: use at most {arch.layers} stages.",
            )
        )
    refusals += _node_shape(layout, gpus_per_node)
    if dcp > 1:
        refusals += _dcp_refusals(arch, tp=tp, dcp=dcp)
    return refusals


def _head_refusals(arch: Architecture, tp: int) -> list[Refusal]:
    """vLLM splits query heads over the TP ranks, and KV heads too, or replicates
    each KV head over tp / KV heads ranks when TP exceeds them."""
    q, kv = arch.query_heads, arch.kv_heads
    fix = _choose("tensor size", wrong=tp, valid=_tensor_sizes(arch))
    if q % tp:
        return [
            Refusal(
                rule="attention-heads",
                message=f"Total number of attention heads ({q}) must be divisible by tensor "
                f"parallel size ({tp}). Fix: {fix}.",
            )
        ]
    if kv % tp and tp % kv:
        return [
            Refusal(
                rule="kv-heads",
                message=f"--tensor-parallel-size ({tp}) must divide the model's {kv} KV heads "
                f"or be a multiple of them (vLLM splits KV heads over the ranks, or replicates "
                f"each over several). Fix: {fix}.",
            )
        ]
    return []


def _node_shape(layout: Layout, gpus_per_node: int) -> list[Refusal]:
    gpus = layout.gpus_per_replica
    if gpus <= gpus_per_node or gpus % gpus_per_node == 0:
        return []
    return [
        Refusal(
            rule="node-shape",
            message=f"one replica needs tensor x pipeline = {gpus} GPUs, more than a node's "
            f"{gpus_per_node} but not a whole number of nodes: vLLM starts the same number "
            f"of ranks on every node. Fix: make tensor x pipeline at most {gpus_per_node} "
            f"or a multiple of it.",
        )
    ]


def _dcp_refusals(arch: Architecture | None, *, tp: int, dcp: int) -> list[Refusal]:
    """vLLM 0.32's checks of --decode-context-parallel-size (config/parallel.py, model.py).
    MLA caches one latent per token, like one KV head, so only the first applies."""
    if tp % dcp:
        return [
            Refusal(
                rule="dcp-divides-tp",
                message=f"tp_size={tp} must be divisible by dcp_size={dcp}. "
                f"Fix: {_choose('decode context size', wrong=dcp, valid=_divisors(tp))}.",
            )
        ]
    if arch is None or arch.attention == "MLA":
        return []
    q, kv = arch.query_heads, arch.kv_heads
    if tp <= kv:
        return [
            Refusal(
                rule="dcp-needs-replicated-kv",
                message=f"Decode context parallelism for GQA/MQA requires "
                f"--tensor-parallel-size ({tp}) to be greater than the model's total number "
                f"of KV heads ({kv}). Fix: at this tensor size no KV head is replicated, so DCP "
                f"has nothing to remove: set decode context to 1, or tensor above {kv}.",
            )
        ]
    refusals: list[Refusal] = []
    if dcp > tp // kv:
        refusals.append(
            Refusal(
                rule="dcp-max",
                message=f"--decode-context-parallel-size ({dcp}) exceeds the maximum supported "
                f"value ({tp // kv}) for --tensor-parallel-size ({tp}) and {kv} model KV heads. "
                f"Fix: set decode context to at most {tp // kv}, the copies of each KV head "
                f"at tensor {tp}.",
            )
        )
    if (q // kv) % dcp:
        refusals.append(
            Refusal(
                rule="dcp-query-heads",
                message=f"The model's number of query heads per KV head ({q // kv}) must be "
                f"divisible by --decode-context-parallel-size ({dcp}) for GQA/MQA. "
                f"Fix: {_choose('decode context size', wrong=dcp, valid=_divisors(q // kv))}.",
            )
        )
    return refusals


def _context_refusals(arch: Architecture, model_len: int) -> list[Refusal]:
    if arch.context_length and model_len > arch.context_length:
        return [
            Refusal(
                rule="max-model-len",
                message=f"User-specified max_model_len ({model_len}) is greater than the derived "
                f"max_model_len (max_position_embeddings={arch.context_length} in the model's "
                f"config.json). Fix: lower maxModelLen to at most {arch.context_length}.",
            )
        ]
    return []


def _no_memory(weights: Fraction, usable: Fraction) -> Refusal:
    return Refusal(
        rule="weights-fit",
        message="No available memory for the cache blocks: the weights take "
        f"{float(weights / GiB):.1f} GiB of each GPU and memory x utilisation - overhead "
        f"leaves {float(usable / GiB):.1f} GiB. Fix: spread the weights over more GPUs "
        "(raise tensor or pipeline), raise gpuMemoryUtilization, or use larger GPUs.",
    )


def _full_length(
    *, model_len: int, kv_per_token: Fraction, budget: Fraction, tokens: int, replicated: bool
) -> Refusal:
    needed = model_len * kv_per_token
    dcp_hint = ", or decode context to remove replicated KV heads" if replicated else ""
    return Refusal(
        rule="full-length-request",
        message=f"To serve at least one request with the model's max seq len ({model_len}), "
        f"{float(needed / GiB):.2f} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({float(budget / GiB):.2f} GiB). Estimated maximum model length is "
        f"{tokens}. Fix: lower maxModelLen to at most {tokens}, or free memory for the KV "
        f"cache (more tensor or pipeline GPUs, a higher gpuMemoryUtilization{dcp_hint}).",
    )


def _cluster_refusals(layout: Layout, *, per_node: int, nodes: int) -> list[Refusal]:
    if layout.gpus_per_replica <= per_node:
        needed = ceil(layout.data / (per_node // layout.gpus_per_replica))
    else:
        needed = layout.data * layout.nodes_per_replica(per_node)
    if needed <= nodes:
        return []
    return [
        Refusal(
            rule="cluster-gpus",
            message=f"the layout needs {needed} nodes of {per_node} GPUs and {nodes} are "
            f"available. Fix: fewer replicas, or fewer GPUs per replica.",
        )
    ]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tensor_sizes(arch: Architecture) -> list[int]:
    """Tensor sizes vLLM accepts for these heads."""
    q, kv = arch.query_heads, arch.kv_heads
    return [t for t in _divisors(q) if kv % t == 0 or t % kv == 0]


def _choose(what: str, *, wrong: int, valid: list[int]) -> str:
    below = [v for v in valid if v < wrong]
    above = [v for v in valid if v > wrong]
    nearest = ([below[-1]] if below else []) + ([above[0]] if above else [])
    choices = " or ".join(str(v) for v in nearest)
    return f"set the {what} to {choices} (valid: {', '.join(str(v) for v in valid)})"
