"""A small async Kubernetes API client: server-side apply with shoal's field
manager, list by label, patch, delete. One aiohttp session for the process.

Credentials come from kopf's own login (in-cluster ServiceAccount, else
kubeconfig); a 401 logs in again, as ServiceAccount tokens rotate."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf

from shoal import __version__
from shoal.api import API_VERSION, KIND, PLURAL
from shoal.controller.identity import Manifest
from shoal.controller.names import FIELD_MANAGER

log = logging.getLogger("shoal.controller.kube")

# (apiVersion, kind) -> plural, for every kind the operator touches.
PLURALS = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "Deployment"): "deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    (API_VERSION, KIND): PLURAL,
}

Login = Callable[[], kopf.ConnectionInfo]
# Names the operator's own requests in the API server's audit log.
USER_AGENT = f"shoal-operator/{__version__}"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{PLURALS[(api_version, kind)]}"
    return f"{path}/{name}" if name else path


def login() -> kopf.ConnectionInfo:
    """The operator's credentials, found as kopf finds its own."""
    info = kopf.login_via_client(logger=log, settings=kopf.OperatorSettings())
    if info is None:
        raise kopf.LoginError("no Kubernetes credentials: neither in-cluster nor a kubeconfig")
    return info


class KubeApi:
    def __init__(self, login: Login = login) -> None:
        self._login = login
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    async def _connect(self, *, renew: bool = False) -> tuple[aiohttp.ClientSession, str]:
        async with self._lock:
            if self._info is None or renew:
                self._info = await asyncio.to_thread(self._login)
                if self._session is not None:
                    await self._session.close()
                connector = aiohttp.TCPConnector(
                    ssl=self._info.as_ssl_context(), limit=32, limit_per_host=32
                )
                self._session = aiohttp.ClientSession(
                    connector=connector,
                    headers={**self._info.as_http_headers(), "User-Agent": USER_AGENT},
                    timeout=aiohttp.ClientTimeout(total=60),
                )
            assert self._session is not None
            return self._session, self._info.server.rstrip("/")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        for attempt in range(2):
            session, server = await self._connect(renew=attempt > 0)
            async with session.request(
                method, server + path, params=params, data=data, headers=headers
            ) as response:
                text = await response.text()
                if response.status == 401 and attempt == 0:
                    continue  # a rotated token: log in again once
                if response.status >= 400:
                    raise ApiError(response.status, _message(text))
                return json.loads(text) if text else None
        raise AssertionError("unreachable")

    async def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply under shoal's field manager. force: shoal owns the
        fields it sets, even if someone else wrote them."""
        meta = manifest["metadata"]
        path = object_path(
            manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
        )
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        applied: Manifest = await self.request(
            "PATCH", path, params=params, body=manifest, content_type="application/apply-patch+yaml"
        )
        return applied

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            found: Manifest = await self.request(
                "GET", object_path(api_version, kind, namespace, name)
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    async def list_nodes(self) -> list[Manifest]:
        listing = await self.request("GET", "/api/v1/nodes")
        items: list[Manifest] = listing.get("items", [])
        return items

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[Manifest]:
        listing = await self.request(
            "GET", object_path(api_version, kind, namespace), params={"labelSelector": selector}
        )
        items: list[Manifest] = listing.get("items", [])
        return items

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> Manifest:
        path = object_path(api_version, kind, namespace, name)
        if subresource:
            path += f"/{subresource}"
        patched: Manifest = await self.request(
            "PATCH",
            path,
            params={"fieldManager": FIELD_MANAGER},
            body=body,
            content_type=f"application/{patch_type}-patch+json",
        )
        return patched

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete (only the object with that uid, when given); False if already gone.
        grace_seconds 0 force-deletes a pod (its node is gone and cannot confirm)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", object_path(api_version, kind, namespace, name), body=body)
        except ApiError as error:
            if error.status in (404, 409):  # gone, or replaced by a newer object
                return False
            raise
        return True


def _message(text: str) -> str:
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text[:500]
