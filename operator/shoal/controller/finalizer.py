"""Taking shoal's finalizer off a VLLMCluster when kopf cannot.

kopf puts the finalizer on every VLLMCluster (for the per-cluster daemon) and
takes it off once a deleted cluster's daemon has stopped. Two cases escape
it: the operator uninstalled (`shoal release`, the chart's post-delete hook)
and a watched namespace or the CRD being deleted. kopf stops watching a
namespace at the first status its deletion writes, before the namespace
controller has deleted the VLLMClusters in it (and does not watch one already
being deleted when it starts); it stops watching VLLMClusters once their CRD
is being deleted (it cannot patch them any more, it says). Either way it
never sees them go, and the namespace or the CRD would stay Terminating for
ever. controller/handlers.py calls these then."""

from __future__ import annotations

from typing import Any

from shoal.api import API_VERSION, KIND
from shoal.controller.identity import Manifest
from shoal.controller.kube import ApiError, KubeApi
from shoal.controller.names import FINALIZER

# A finalizer list changed under the patch (its `test` failed): read again.
ATTEMPTS = 3


def finalizer_patch(finalizers: list[str]) -> list[dict[str, Any]] | None:
    """A JSON patch that removes shoal's finalizer, and only if the list is still
    the one read (`test`); None when it is not there."""
    if FINALIZER not in finalizers:
        return None
    at = f"/metadata/finalizers/{finalizers.index(FINALIZER)}"
    return [{"op": "test", "path": at, "value": FINALIZER}, {"op": "remove", "path": at}]


async def release(kube: KubeApi, cluster: Manifest) -> bool:
    """Remove shoal's finalizer from one VLLMCluster, as read; whether it had it
    (False also when the cluster has gone)."""
    meta = cluster["metadata"]
    ns, name = meta["namespace"], meta["name"]
    for _ in range(ATTEMPTS):
        patch = finalizer_patch(list(meta.get("finalizers") or []))
        if patch is None:
            return False
        try:
            await kube.patch(API_VERSION, KIND, ns, name, patch, patch_type="json")
            return True
        except ApiError as error:
            if error.status == 404:
                return False
            if error.status not in (409, 422):
                raise
        found = await kube.get(API_VERSION, KIND, ns, name)
        if found is None:
            return False
        meta = found["metadata"]
    raise ApiError(409, f"{ns}/{name}: its finalizers kept changing; try again")


async def namespace_going(kube: KubeApi, namespace: str) -> bool:
    """Whether the namespace is being deleted, as the API server has it now."""
    found = await kube.list("v1", "Namespace", "", "", fields=f"metadata.name={namespace}")
    return any(ns["metadata"].get("deletionTimestamp") for ns in found)


async def release_deleted(kube: KubeApi, namespace: str) -> list[str]:
    """Take the finalizer off the namespace's VLLMClusters already deleted;
    the names of those released."""
    released = []
    for cluster in await kube.list(API_VERSION, KIND, namespace, ""):
        if cluster["metadata"].get("deletionTimestamp") and await release(kube, cluster):
            released.append(cluster["metadata"]["name"])
    return released
