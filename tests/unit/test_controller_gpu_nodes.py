"""The GPU facts the engines' manifests are built from (GFD's node labels)
do not come and go with the API server's answers: a node list it fails to
give keeps the last one read (a 429 or 5xx), so no replica is replaced for
it; nodes the operator may not read leave the spec's own fields."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from shoal.controller.context import ClusterState
from shoal.controller.kube import ApiError
from shoal.controller.reconcile import gpu_nodes


class Nodes:
    def __init__(self) -> None:
        self.answer: list[dict[str, Any]] | ApiError = []

    async def list_nodes(self) -> list[dict[str, Any]]:
        if isinstance(self.answer, ApiError):
            raise self.answer
        return self.answer


def node(count: str) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.count": count, "nvidia.com/gpu.memory": "81559"}
    return {"metadata": {"name": f"n{count}", "labels": labels}, "status": {"big": "x" * 100}}


def test_a_node_list_the_api_server_fails_to_give_keeps_the_last_one_read() -> None:
    kube = Nodes()
    ctx: Any = SimpleNamespace(kube=kube)
    state = ClusterState()

    async def scenario() -> None:
        # Before anything was read, a failed list gives nothing to build on.
        kube.answer = ApiError(503, "etcdserver: leader changed")
        assert await gpu_nodes(ctx, state) is None
        kube.answer = [node("4"), {"metadata": {"name": "cpu", "labels": {}}}]
        first = await gpu_nodes(ctx, state)
        assert first == [{"metadata": {"labels": node("4")["metadata"]["labels"]}}]
        # Before: [] here, so gpu.perNode fell back to 8 and every replica of
        # a tensor-parallel 8 fleet was rebuilt as one pod, then back again.
        for status in (429, 500, 503, 504):
            kube.answer = ApiError(status, "busy")
            assert await gpu_nodes(ctx, state) == first
        # Nodes the operator may not read: the spec's own gpu fields stand.
        kube.answer = ApiError(403, "forbidden")
        assert await gpu_nodes(ctx, state) == []

    asyncio.run(scenario())
