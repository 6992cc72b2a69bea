"""`shoal plan`'s table: one row per layout, refusals below it."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from shoal.planner.architecture import Architecture
from shoal.planner.plan import GPU, ROUNDING_NOTE
from shoal.planner.result import CapacityPlan
from shoal.schema.quantity import format_bytes

_HEADERS = (
    "layout",
    "GPUs",
    "nodes/replica",
    "weights/GPU",
    "KV/token/GPU",
    "KV pools",
    "tokens/pool",
    "tokens total",
    "max-len reqs/pool",
    "fits",
)


def describe(arch: Architecture, gpu: GPU, *, max_model_len: int) -> str:
    """Two lines saying what was planned for."""
    attention = "MLA latent" if arch.attention == "MLA" else "KV heads"
    return (
        f"{arch.name}: {arch.layers} layers, {arch.query_heads} query heads, {arch.kv_heads} "
        f"{attention}, head size {arch.head_size}, {_billions(arch.parameters)} parameters "
        f"in {arch.dtype}\n"
        f"GPU: {format_bytes(gpu.memory)} x {float(gpu.utilization):.2f} utilisation - "
        f"{format_bytes(gpu.overhead)} overhead, {gpu.per_node} per node; "
        f"max model len {f'{max_model_len:,}' if max_model_len else 'unknown (set it)'}"
    )


def render(plans: Sequence[CapacityPlan]) -> str:
    """The comparison table, the refusals, and the note on block rounding."""
    rows = [_row(plan) for plan in plans]
    widths = [max(len(cell) for cell in column) for column in zip(_HEADERS, *rows, strict=True)]
    lines = [_line(_HEADERS, widths)] + [_line(row, widths) for row in rows] + [""]
    for plan in plans:
        lines += [f"{plan.layout} refused: {refusal.message}" for refusal in plan.refusals]
    lines.append(ROUNDING_NOTE)
    return "\n".join(lines)


def _row(plan: CapacityPlan) -> tuple[str, ...]:
    return (
        plan.layout,
        str(plan.gpus_per_replica * plan.replicas),
        str(plan.nodes_per_replica),
        format_bytes(plan.weight_bytes_per_gpu),
        format_bytes(plan.kv_bytes_per_token_per_gpu, "KiB"),
        str(plan.replicas),
        f"{plan.kv_tokens_per_replica:,}",
        f"{plan.kv_tokens_total:,}",
        f"{plan.max_concurrency_per_replica:.2f}x" if plan.max_model_len else "-",
        "yes" if plan.fits else "no",
    )


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    # The layout reads left-aligned; numbers line up on the right.
    first = cells[0].ljust(widths[0])
    rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
    return "  ".join((first, *rest)).rstrip()


def _billions(parameters: int) -> str:
    return f"{float(Fraction(parameters, 10**9)):g}e9"
