"""The testbed's fake nodes, as pure manifests.

Four nodes of one GPU product with 8 GPUs each, one node of another product
(so placement by product can be tested), and one CPU-only node where routers
and other non-GPU pods land. GPU nodes carry the taint GPU node pools usually
carry, so a pod must tolerate it to land there.

Each node gets a podCIDR inside 127.<octet>.0.0/16: Linux routes all of
127.0.0.0/8 to the loopback device, so local processes can listen on every pod
IP kwok hands out, and no packet leaves the machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class NodeShape:
    name: str
    gpus: int
    product: str | None
    cpu: str = "96"
    memory: str = "1536Gi"


DEFAULT_NODES = (
    *(NodeShape(f"gpu-h100-{i}", 8, "NVIDIA-H100-80GB-HBM3") for i in range(4)),
    NodeShape("gpu-l4-0", 8, "NVIDIA-L4", cpu="48", memory="192Gi"),
    NodeShape("cpu-0", 0, None, cpu="32", memory="128Gi"),
)


def pod_cidr(octet: int, index: int) -> str:
    return f"127.{octet}.{index + 1}.0/24"


def build_node(shape: NodeShape, *, index: int, octet: int) -> dict[str, Any]:
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": "110",
        "ephemeral-storage": "1Ti",
    }
    labels = {
        "kubernetes.io/hostname": shape.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    taints: list[dict[str, str]] = []
    if shape.gpus:
        resources[GPU_RESOURCE] = str(shape.gpus)
        taints.append(dict(GPU_TAINT))
    if shape.product:
        labels[GPU_PRODUCT_LABEL] = shape.product
        labels["nvidia.com/gpu.count"] = str(shape.gpus)
    cidr = pod_cidr(octet, index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": shape.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake"},
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": taints},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def build_nodes(
    *, octet: int, shapes: tuple[NodeShape, ...] = DEFAULT_NODES
) -> list[dict[str, Any]]:
    return [build_node(shape, index=i, octet=octet) for i, shape in enumerate(shapes)]
