"""The operator under test, as a local process with the admin kubeconfig
(the Helm chart's ServiceAccount takes over in a later issue), and helpers
to read what it built."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from shoal.api.crd import CRD_NAME, CRD_PATHS
from shoal.procs import LocalProcess, ready_router, start_operator
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import get_json, wait_for

REPO = Path(__file__).resolve().parents[2]
ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
WARMED = "serving.shoal.dev/warmed"
# Kinds the operator creates for a cluster, as kubectl names them.
CHILD_KINDS = (
    "statefulsets",
    "pods",
    "deployments",
    "services",
    "configmaps",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "poddisruptionbudgets",
)


def install_crd(bed: Testbed) -> None:
    """The chart's CRD, applied as a user would."""
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_PATHS[1]))
    bed.wait_crd_established(CRD_NAME)


def operator(
    bed: Testbed, log: Path, *, namespaces: Sequence[str], extra: Sequence[str] = ()
) -> LocalProcess:
    """The operator with the admin kubeconfig; `with` stops it on leaving."""
    return start_operator(kubeconfig=bed.kubeconfig, namespaces=namespaces, log=log, args=extra)


def cluster_manifest(
    name: str,
    *,
    replicas: int = 2,
    tensor: int = 4,
    model: str = MODEL,
    image: str = ENGINE_IMAGE,
    time_scale: float = 50,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": model},
        "image": image,
        "replicas": replicas,
        "parallelism": {"tensor": tensor},
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": 8192, "extraArgs": ["--sim-time-scale", str(time_scale)]},
        **spec,
        # Tests see which replica answered (x-shoal-replica), a debugging setting.
        "router": {"replicaHeader": True, **spec.get("router", {})},
    }
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": name},
        "spec": body,
    }


def cluster(bed: Testbed, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(bed, "vllmcluster", name, "-n", ns)
    return found


def printed_columns(bed: Testbed, ns: str, name: str) -> dict[str, str]:
    """`kubectl get vllmclusters` as a user reads it: header -> value."""
    header, row = bed.kubectl("get", "vllmclusters", name, "-n", ns).splitlines()[:2]
    return dict(zip(header.split(), row.split(), strict=False))


def wait_ready(bed: Testbed, ns: str, name: str, replicas: int, *, timeout: float = 120) -> None:
    def ready() -> bool:
        columns = printed_columns(bed, ns, name)
        status = cluster(bed, ns, name).get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return (
            columns.get("READY") == str(replicas)
            and columns.get("WARM") == str(replicas)
            and status.get("replicas") == replicas
            and conditions.get("Ready") == "True"
        )

    wait_for(ready, what=f"{name} READY {replicas}", timeout=timeout, interval=0.5)


def children(bed: Testbed, ns: str, name: str, kind: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        bed, kind, "-n", ns, "-l", f"serving.shoal.dev/cluster={name}"
    )["items"]
    return items


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in items)


def leader_pods(bed: Testbed, ns: str, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in children(bed, ns, name, "pods")
        if p["metadata"]["labels"].get("serving.shoal.dev/role") == "leader"
    ]


def condition_of(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for found in pod.get("status", {}).get("conditions", []):
        if found["type"] == kind:
            return dict(found)
    return {}


def router_url(bed: Testbed, ns: str, name: str) -> str:
    """The router pod's address (the pod runner runs `shoal router` there)."""

    return wait_for(
        lambda: ready_router(children(bed, ns, name, "pods")),
        what=f"{name}'s router answering /ready",
        timeout=60,
    )


def complete(url: str, prompt: str, *, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(
        url + "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens},
        timeout=30,
    )


def events(bed: Testbed, ns: str, name: str) -> list[dict[str, Any]]:
    raw = bed.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(raw)["items"]
    return items


def delete_clusters(bed: Testbed, ns: str) -> None:
    """Delete the namespace's VLLMClusters; with no operator left to remove its
    finalizer (a test failed early), remove it, so the namespace can go."""
    bed.kubectl("delete", "vllmclusters", "--all", "-n", ns, "--wait=false", check=False)
    try:
        wait_for(
            lambda: not get_json(bed, "vllmclusters", "-n", ns)["items"],
            what=f"VLLMClusters in {ns} deleted",
            timeout=20,
        )
    except TimeoutError:
        for item in get_json(bed, "vllmclusters", "-n", ns)["items"]:
            name = item["metadata"]["name"]
            patch = json.dumps({"metadata": {"finalizers": None}})
            bed.kubectl("patch", "vllmcluster", name, "-n", ns, "--type=merge", "-p", patch)
