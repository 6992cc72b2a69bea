"""The operator's Kubernetes API client, on kr8s: server-side apply with shoal's
field manager, get, list by label, patch, delete, a pod's log. kopf watches and
runs the handlers; what the operator itself reads and writes goes through here.

Why kr8s: one maintained async client (dask-kubernetes' operator uses it)
built on httpx, the HTTP library of the rest of the control plane, engine
probes included, so the operator carries one HTTP stack; and it knows each
built-in kind's API path and scope, so shoal keeps no table of plurals (its
own kind is registered below from `shoal.api`). Only kr8s's transport is
used: each call here is one request with the exact verb, content type and
parameters shoal means (server-side apply, uid preconditions), not kr8s's
object helpers. Credentials and token rotation: `shoal.apiserver`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import kr8s
import kr8s.asyncio
from kr8s.asyncio.objects import APIObject, get_class, new_class

from shoal.api import API_VERSION, KIND, PLURAL
from shoal.apiserver import connect, user_agent
from shoal.controller.identity import Manifest
from shoal.controller.names import FIELD_MANAGER

TIMEOUT = httpx.Timeout(60.0)

# The VLLMCluster kind, beside the built-in kinds kr8s knows.
VLLMClusterObject = new_class(KIND, API_VERSION, namespaced=True, plural=PLURAL)
# And Lease, which kr8s 0.20 does not know (shoal.controller.lease).
LeaseObject = new_class("Lease", "coordination.k8s.io/v1", namespaced=True, plural="leases")


class ApiError(Exception):
    """The API server refused a request (HTTP status >= 400)."""

    def __init__(self, status: int, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message  # the API server's own words
        self.causes = causes  # its Status' details.causes[].reason


# The cause of a create refused in a namespace being deleted.
NAMESPACE_TERMINATING = "NamespaceTerminating"


def kind_of(api_version: str, kind: str) -> type[APIObject]:
    """kr8s's class for a kind: its group/version, plural and scope."""
    return get_class(kind, api_version)


class KubeApi:
    """One kr8s connection for the process, made on first use."""

    def __init__(self, *, kubeconfig: str | None = None, component: str = "operator") -> None:
        self._kubeconfig = kubeconfig
        self._headers = user_agent(component)
        self._api: kr8s.asyncio.Api | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> kr8s.asyncio.Api:
        async with self._lock:
            if self._api is None:
                self._api = await connect(kubeconfig=self._kubeconfig)
            return self._api

    async def close(self) -> None:
        # kr8s has no close of its own; its httpx session is all it holds.
        session = self._api._session if self._api is not None else None
        if session is not None:
            await session.aclose()

    async def _call(
        self,
        method: str,
        *,
        version: str,
        url: str,
        namespace: str | None = None,
        base: str = "",
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        text: bool = False,
    ) -> Any:
        """One request; the answer's JSON (or its text: a pod's log). Refusals
        raise ApiError; an unreachable or silent API server raises
        ConnectionError or TimeoutError (both OSError, which the handlers retry)."""
        headers = dict(self._headers)
        content = None
        if body is not None:
            content = json.dumps(body)
            headers["Content-Type"] = content_type
        try:
            api = await self._connect()
            async with api.call_api(
                method,
                version=version,
                base=base,
                namespace=namespace,
                url=url,
                params=params,
                content=content,
                headers=headers,
                timeout=TIMEOUT,
            ) as response:
                if text:
                    return response.text
                return response.json() if response.content else None
        except kr8s.ServerError as error:
            answer = error.response
            if answer is None:
                raise ApiError(0, str(error)) from error
            message, causes = _status(answer.text)
            raise ApiError(answer.status_code, message, causes) from error
        except kr8s.APITimeoutError as error:
            raise TimeoutError(f"Kubernetes API: {error}") from error
        except httpx.TransportError as error:
            raise ConnectionError(f"Kubernetes API: {error!r}") from error

    async def _object(
        self,
        method: str,
        *,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        **request: Any,
    ) -> Any:
        cls = kind_of(api_version, kind)
        url = "/".join(part for part in (cls.endpoint, name, subresource) if part)
        return await self._call(
            method,
            version=cls.version,
            namespace=namespace if cls.namespaced else None,
            url=url,
            **request,
        )

    async def resource_names(self, group_version: str) -> list[str]:
        """The resources a group/version serves (its discovery document);
        ApiError 404 when the API server does not serve it."""
        base = "/api" if group_version == "v1" else "/apis"
        listing = await self._call("GET", version="", base=base, url=group_version)
        return [str(resource.get("name")) for resource in listing.get("resources", [])]

    async def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply under shoal's field manager. force: shoal owns the
        fields it sets, even if someone else wrote them."""
        meta = manifest["metadata"]
        applied: Manifest = await self._object(
            "PATCH",
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            namespace=meta["namespace"],
            name=meta["name"],
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=manifest,  # JSON is YAML
            content_type="application/apply-patch+yaml",
        )
        return applied

    async def create(self, manifest: Manifest) -> Manifest:
        """POST a new object (one named by metadata.generateName, say an Event)."""
        created: Manifest = await self._object(
            "POST",
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            namespace=manifest["metadata"]["namespace"],
            params={"fieldManager": FIELD_MANAGER},
            body=manifest,
        )
        return created

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            found: Manifest = await self._object(
                "GET", api_version=api_version, kind=kind, namespace=namespace, name=name
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    async def log(
        self,
        namespace: str,
        pod: str,
        *,
        container: str,
        previous: bool,
        tail_lines: int,
        limit_bytes: int,
    ) -> str:
        """A container's log (pods/log; `previous`: its run before the current
        one): the last tail_lines, of which no more than limit_bytes."""
        params = {
            "container": container,
            "previous": str(previous).lower(),
            "tailLines": str(tail_lines),
            "limitBytes": str(limit_bytes),
        }
        log: str = await self._object(
            "GET",
            api_version="v1",
            kind="Pod",
            namespace=namespace,
            name=pod,
            subresource="log",
            params=params,
            text=True,
        )
        return log

    async def list_nodes(self) -> list[Manifest]:
        listing = await self._object("GET", api_version="v1", kind="Node")
        items: list[Manifest] = listing.get("items", [])
        return items

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str, *, fields: str = ""
    ) -> list[Manifest]:
        params = {"labelSelector": selector}
        if fields:
            params["fieldSelector"] = fields
        listing = await self._object(
            "GET", api_version=api_version, kind=kind, namespace=namespace, params=params
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
        field_manager: str = FIELD_MANAGER,
    ) -> Manifest:
        patched: Manifest = await self._object(
            "PATCH",
            api_version=api_version,
            kind=kind,
            namespace=namespace,
            name=name,
            subresource=subresource,
            params={"fieldManager": field_manager},
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
            await self._object(
                "DELETE",
                api_version=api_version,
                kind=kind,
                namespace=namespace,
                name=name,
                body=body,
            )
        except ApiError as error:
            if error.status in (404, 409):  # gone, or replaced by a newer object
                return False
            raise
        return True


def _status(text: str) -> tuple[str, tuple[str, ...]]:
    """The message and the causes' reasons of a refusal's Status."""
    try:
        status = json.loads(text)
        causes = (status.get("details") or {}).get("causes") or []
        reasons = tuple(str(c["reason"]) for c in causes if isinstance(c, dict) and "reason" in c)
        return str(status.get("message", text)), reasons
    except (ValueError, AttributeError):
        return text[:500], ()
