"""The operator's API client (kr8s) against a stand-in API server on loopback:
what each call sends (server-side apply under shoal's field manager, uid
preconditions, the user agent), how refusals and a vanished server surface,
and that a rotated token is read again after a 401."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from shoal import __version__
from shoal.api import API_VERSION, KIND
from shoal.controller.kube import ApiError, KubeApi
from shoal.controller.names import FIELD_MANAGER
from tests.integration.fake_apiserver import FakeApiServer, fake_apiserver

Scenario = Callable[[FakeApiServer, KubeApi], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario) -> None:
    async def main() -> None:
        async with fake_apiserver(tmp_path) as server:
            kube = KubeApi(kubeconfig=str(server.kubeconfig))
            try:
                await scenario(server, kube)
            finally:
                await kube.close()

    asyncio.run(main())


def config_map(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "team"},
        "data": {"k": "v"},
    }


def test_apply_is_server_side_apply_forced_under_shoals_field_manager(tmp_path: Path) -> None:
    async def scenario(server: FakeApiServer, kube: KubeApi) -> None:
        cluster = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "llama", "namespace": "team"},
            "spec": {},
        }
        statefulset = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "llama-0", "namespace": "team"},
        }
        for manifest in (config_map("cfg"), cluster, statefulset):
            await kube.apply(manifest)
        patches = server.requests("PATCH")
        assert [p.path for p in patches] == [
            "/api/v1/namespaces/team/configmaps/cfg",
            f"/apis/{API_VERSION}/namespaces/team/vllmclusters/llama",
            "/apis/apps/v1/namespaces/team/statefulsets/llama-0",
        ]
        for patch, manifest in zip(patches, (config_map("cfg"), cluster, statefulset), strict=True):
            assert patch.query == {"fieldManager": FIELD_MANAGER, "force": "true"}
            assert patch.headers["Content-Type"] == "application/apply-patch+yaml"
            assert patch.headers["User-Agent"] == f"shoal-operator/{__version__}"
            assert patch.body == manifest

    run(tmp_path, scenario)


def test_patches_name_their_type_and_subresource(tmp_path: Path) -> None:
    async def scenario(server: FakeApiServer, kube: KubeApi) -> None:
        body: dict[str, Any] = {"status": {"conditions": []}}
        await kube.patch(
            "v1", "Pod", "team", "p", body, subresource="status", patch_type="strategic-merge"
        )
        await kube.patch(API_VERSION, KIND, "team", "llama", {"status": {}}, subresource="status")
        first, second = server.requests("PATCH")
        assert first.path == "/api/v1/namespaces/team/pods/p/status"
        assert first.headers["Content-Type"] == "application/strategic-merge-patch+json"
        assert first.query == {"fieldManager": FIELD_MANAGER} and first.body == body
        assert second.path == f"/apis/{API_VERSION}/namespaces/team/vllmclusters/llama/status"
        assert second.headers["Content-Type"] == "application/merge-patch+json"

    run(tmp_path, scenario)


def test_delete_removes_only_the_object_with_that_uid(tmp_path: Path) -> None:
    async def scenario(server: FakeApiServer, kube: KubeApi) -> None:
        path = "/api/v1/namespaces/team/pods/p"
        server.answers[("DELETE", path)] = (200, {"kind": "Status"})
        assert await kube.delete("v1", "Pod", "team", "p", uid="u1", grace_seconds=0) is True
        assert server.requests("DELETE")[0].body == {
            "propagationPolicy": "Background",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": "u1"},
        }
        server.answers[("DELETE", path)] = (409, {"message": "Precondition failed: UID"})
        assert await kube.delete("v1", "Pod", "team", "p", uid="old") is False
        del server.answers[("DELETE", path)]
        assert await kube.delete("v1", "Pod", "team", "p") is False  # already gone

    run(tmp_path, scenario)


def test_reads_list_by_label_and_a_missing_object_is_none(tmp_path: Path) -> None:
    async def scenario(server: FakeApiServer, kube: KubeApi) -> None:
        server.answers[("GET", "/api/v1/namespaces/team/pods")] = (200, {"items": [{"a": 1}]})
        server.answers[("GET", "/api/v1/nodes")] = (200, {"items": [{"n": 1}]})
        assert await kube.list("v1", "Pod", "team", "app=x") == [{"a": 1}]
        assert server.seen[-1].query == {"labelSelector": "app=x"}
        assert await kube.list_nodes() == [{"n": 1}]
        assert await kube.get("apps/v1", "Deployment", "team", "gone") is None

    run(tmp_path, scenario)


def test_a_refused_write_carries_the_api_servers_status_and_message(tmp_path: Path) -> None:
    async def scenario(server: FakeApiServer, kube: KubeApi) -> None:
        path = "/api/v1/namespaces/team/configmaps/cfg"
        server.answers[("PATCH", path)] = (422, {"message": 'ConfigMap "cfg" is invalid'})
        with pytest.raises(ApiError) as refused:
            await kube.apply(config_map("cfg"))
        assert refused.value.status == 422
        assert str(refused.value) == 'HTTP 422: ConfigMap "cfg" is invalid'

    run(tmp_path, scenario)


def test_a_rotated_token_is_read_again_after_a_401(tmp_path: Path) -> None:
    async def scenario(server: FakeApiServer, kube: KubeApi) -> None:
        path = "/api/v1/namespaces/team/configmaps/cfg"
        server.answers[("GET", path)] = (200, config_map("cfg"))
        assert await kube.get("v1", "ConfigMap", "team", "cfg") is not None
        # The credentials rotate: the old token stops working, the file changes.
        server.token = "second"
        server.write_kubeconfig("second")
        assert await kube.get("v1", "ConfigMap", "team", "cfg") is not None
        assert server.seen[-1].headers["Authorization"] == "Bearer second"

    run(tmp_path, scenario)


def test_an_unreachable_api_server_is_a_connection_error_the_handlers_retry(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with fake_apiserver(tmp_path) as server:
            kube = KubeApi(kubeconfig=str(server.kubeconfig))
            server.answers[("GET", "/api/v1")] = (200, {"resources": [{"name": "pods"}]})
            assert await kube.resource_names("v1") == ["pods"]
        # The server is gone now.
        with pytest.raises(OSError):
            await kube.list_nodes()
        await kube.close()

    asyncio.run(main())
