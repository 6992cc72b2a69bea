"""Where engine pods may run: GPU product, GPU taint, and how the pods of one
group and of different replicas spread over nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shoal.api.spec import VLLMClusterSpec
from shoal.controller.names import LABEL_REPLICA, engine_selector, group_selector

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# GPU Feature Discovery's labels (the NVIDIA GPU operator runs it): GPUs on
# the node, and one GPU's memory in MiB as the driver reports it.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
HOSTNAME = "kubernetes.io/hostname"


def with_gpu_facts(spec: VLLMClusterSpec, nodes: Sequence[Mapping[str, Any]]) -> VLLMClusterSpec:
    """The spec with gpu.perNode and gpu.memory, where it leaves them unset,
    read from GFD's labels on the nodes its engines may run on (the product's
    and placement.nodeSelector's). Only when those nodes agree; else, and
    without labels, the spec's defaults stay. Fields the spec sets win."""
    wanted = node_selector(spec)
    eligible = [
        labels
        for labels in ((n.get("metadata") or {}).get("labels") or {} for n in nodes)
        if all(labels.get(key) == value for key, value in wanted.items())
        and GPU_COUNT_LABEL in labels
    ]
    unset = {"per_node", "memory"} - spec.gpu.model_fields_set
    update: dict[str, Any] = {}
    counts = {labels.get(GPU_COUNT_LABEL) for labels in eligible}
    memories = {labels.get(GPU_MEMORY_LABEL) for labels in eligible}
    if "per_node" in unset and len(counts) == 1 and (count := counts.pop() or "").isdigit():
        update["per_node"] = int(count)
    if "memory" in unset and len(memories) == 1 and (memory := memories.pop() or "").isdigit():
        update["memory"] = f"{memory}Mi"
    if not update:
        return spec
    return spec.model_copy(update={"gpu": spec.gpu.model_copy(update=update)})


def node_selector(spec: VLLMClusterSpec) -> dict[str, str]:
    selector = dict(spec.placement.node_selector)
    if spec.gpu.product:
        selector[GPU_PRODUCT_LABEL] = spec.gpu.product
    return selector


def tolerations(spec: VLLMClusterSpec) -> list[dict[str, Any]]:
    # GPU node pools carry a NoSchedule taint keyed by the GPU resource (the
    # NVIDIA GPU operator's and the cloud providers' convention).
    gpu = {"key": spec.gpu.resource, "operator": "Exists", "effect": "NoSchedule"}
    return [gpu, *spec.placement.tolerations]


def affinity(spec: VLLMClusterSpec, *, cluster: str, index: int, nodes: int) -> dict[str, Any]:
    """The user's affinity plus: a multi-node group's pods on distinct nodes
    (and in one topology domain when topologyKey is set); other replicas
    preferably on other nodes (spreadReplicas)."""
    given = spec.placement.affinity
    user = given.manifest() if given is not None else {}
    required_anti: list[dict[str, Any]] = []
    required_co: list[dict[str, Any]] = []
    preferred_anti: list[dict[str, Any]] = []
    if nodes > 1:
        required_anti.append(_group_term(cluster, index, topology_key=HOSTNAME))
        if spec.placement.topology_key:
            required_co.append(
                _group_term(cluster, index, topology_key=spec.placement.topology_key)
            )
    if spec.placement.spread_replicas:
        others = {
            "matchLabels": engine_selector(cluster),
            "matchExpressions": [
                {"key": LABEL_REPLICA, "operator": "NotIn", "values": [str(index)]}
            ],
        }
        preferred_anti.append(
            {"weight": 100, "podAffinityTerm": {"labelSelector": others, "topologyKey": HOSTNAME}}
        )
    user = _extended(
        user,
        kind="podAntiAffinity",
        rule="requiredDuringSchedulingIgnoredDuringExecution",
        terms=required_anti,
    )
    user = _extended(
        user,
        kind="podAntiAffinity",
        rule="preferredDuringSchedulingIgnoredDuringExecution",
        terms=preferred_anti,
    )
    return _extended(
        user,
        kind="podAffinity",
        rule="requiredDuringSchedulingIgnoredDuringExecution",
        terms=required_co,
    )


def _group_term(cluster: str, index: int, *, topology_key: str) -> dict[str, Any]:
    return {
        "labelSelector": {"matchLabels": group_selector(cluster, index)},
        "topologyKey": topology_key,
    }


def _extended(
    affinity: dict[str, Any], *, kind: str, rule: str, terms: list[dict[str, Any]]
) -> dict[str, Any]:
    """The affinity with terms added to kind's rule."""
    if not terms:
        return affinity
    section = dict(affinity.get(kind) or {})
    section[rule] = [*(section.get(rule) or []), *terms]
    return {**affinity, kind: section}
