"""GPU facts from GPU Feature Discovery's node labels (nvidia.com/gpu.count,
nvidia.com/gpu.memory in MiB, nvidia.com/gpu.product) on the nodes engines
may run on, for the gpu fields the spec leaves unset; fields the spec sets
win, and without labels (or with nodes that disagree) the spec's defaults
stay."""

from __future__ import annotations

from typing import Any

from shoal.controller.placement import with_gpu_facts
from tests.unit.controller_samples import spec_of


def node(
    name: str, *, product: str | None, count: str | None = "8", memory: str | None = "81559"
) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    for key, value in (
        ("nvidia.com/gpu.product", product),
        ("nvidia.com/gpu.count", count),
        ("nvidia.com/gpu.memory", memory),
    ):
        if value is not None:
            labels[key] = value
    return {"metadata": {"name": name, "labels": labels}}


H100 = "NVIDIA-H100-80GB-HBM3"


def test_unset_gpu_fields_come_from_the_labels_of_the_product_s_nodes() -> None:
    nodes = [
        node("a", product=H100, count="4", memory="81559"),
        node("b", product="NVIDIA-L4", count="8", memory="23034"),
    ]
    spec = with_gpu_facts(spec_of(gpu={"product": H100}), nodes)
    assert spec.gpu.per_node == 4
    assert spec.gpu.memory == "81559Mi"  # 79.6Gi, as nvidia-smi reports it


def test_fields_the_spec_sets_win_over_the_labels() -> None:
    nodes = [node("a", product=H100, count="4")]
    spec = with_gpu_facts(spec_of(gpu={"product": H100, "perNode": 8, "memory": "80Gi"}), nodes)
    assert (spec.gpu.per_node, spec.gpu.memory) == (8, "80Gi")


def test_without_a_product_the_gpu_nodes_must_agree_or_the_defaults_stay() -> None:
    same = [
        node("a", product=H100),
        node("b", product=H100),
        node("cpu", product=None, count=None, memory=None),
    ]
    assert with_gpu_facts(spec_of(), same).gpu.memory == "81559Mi"
    mixed = [node("a", product=H100), node("b", product="NVIDIA-L4", memory="23034")]
    spec = with_gpu_facts(spec_of(), mixed)
    assert (spec.gpu.per_node, spec.gpu.memory) == (8, "80Gi")


def test_without_gfd_labels_the_spec_is_unchanged() -> None:
    spec = spec_of(gpu={"product": H100})
    bare = [{"metadata": {"name": "a", "labels": {"nvidia.com/gpu.product": H100}}}]
    assert with_gpu_facts(spec, bare) == spec
    assert with_gpu_facts(spec, []) == spec


def test_nodes_outside_the_placement_node_selector_are_not_read() -> None:
    nodes = [node("a", product=H100, count="4")]
    nodes[0]["metadata"]["labels"]["pool"] = "batch"
    spec = with_gpu_facts(
        spec_of(gpu={"product": H100}, placement={"nodeSelector": {"pool": "online"}}), nodes
    )
    assert spec.gpu.per_node == 8
