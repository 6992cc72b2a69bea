"""A VLLMCluster spec as the planner's inputs, and its capacity plan."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from shoal.api.spec import ModelSpec, VLLMClusterSpec
from shoal.planner.architecture import Architecture
from shoal.planner.layout import Layout
from shoal.planner.plan import GPU, plan
from shoal.planner.presets import PRESETS, preset_for_model
from shoal.planner.result import CapacityPlan
from shoal.schema.quantity import parse_quantity

# The spec field to change for each rule of the planner.
RULE_FIELDS = {
    "attention-heads": "spec.parallelism.tensor",
    "kv-heads": "spec.parallelism.tensor",
    "pipeline-layers": "spec.parallelism.pipeline",
    "node-shape": "spec.parallelism",
    "dcp-divides-tp": "spec.parallelism.decodeContext",
    "dcp-needs-replicated-kv": "spec.parallelism.decodeContext",
    "dcp-max": "spec.parallelism.decodeContext",
    "dcp-query-heads": "spec.parallelism.decodeContext",
    "max-model-len": "spec.engine.maxModelLen",
    "full-length-request": "spec.engine.maxModelLen",
    "weights-fit": "spec.parallelism.tensor",
}

_SHAPE_FIELDS = ("layers", "query_heads", "kv_heads", "head_size", "parameters")


def resolve_architecture(model: ModelSpec) -> Architecture | None:
    """The architecture given (a preset, overridden by any fields beside it), or a
    preset recognised from model.name; None when neither says enough."""
    given = model.architecture
    if given is None:
        preset = preset_for_model(model.name)
        return PRESETS[preset] if preset else None
    overrides = {
        name: value
        for name, value in given.model_dump(exclude={"preset"}).items()
        if value is not None
    }
    if given.preset is not None:
        return dataclasses.replace(PRESETS[given.preset], **overrides)
    if not all(name in overrides for name in _SHAPE_FIELDS):
        return None
    return Architecture(name=model.served_name or model.name, **overrides)


def gpu_of(spec: VLLMClusterSpec) -> GPU:
    return GPU(
        memory=parse_quantity(spec.gpu.memory),
        per_node=spec.gpu.per_node,
        utilization=Fraction(str(spec.engine.gpu_memory_utilization)),
        overhead=parse_quantity(spec.engine.memory_overhead),
    )


def layout_of(spec: VLLMClusterSpec) -> Layout:
    return Layout(
        tensor=spec.parallelism.tensor,
        pipeline=spec.parallelism.pipeline,
        data=spec.replicas,
        decode_context=spec.parallelism.decode_context,
    )


def plan_spec(spec: VLLMClusterSpec) -> CapacityPlan | None:
    """The spec's capacity plan, refusals naming spec fields; None without an architecture."""
    arch = resolve_architecture(spec.model)
    if arch is None:
        return None
    result = plan(
        arch, gpu_of(spec), layout=layout_of(spec), max_model_len=spec.engine.max_model_len
    )
    for refusal in result.refusals:
        refusal.field = RULE_FIELDS.get(refusal.rule)
    return result
