"""Where the replicas are: a static list, or the VLLMCluster's leader pods.

Kubernetes mode lists and watches pods by label in one namespace (the
router's Role may only get, list and watch pods), on the event loop through
kr8s (`shoal.apiserver`). A pod is routable only while running, not
terminating, and ready as kubelet and shoal say (`pod_ready`). Any watch
error or expiry leads to a fresh list, and the fleet is replaced by what the
list says, so no pod the API no longer has is kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import kr8s.asyncio
from kr8s.asyncio.objects import Pod

from shoal.apiserver import connect, user_agent
from shoal.router.fleet import Endpoint

log = logging.getLogger("shoal.router.discovery")

Publish = Callable[[list[Endpoint]], None]
HEADERS = user_agent("router")
LIST_TIMEOUT = httpx.Timeout(30.0)


def static_endpoints(urls: Sequence[str]) -> list[Endpoint]:
    endpoints = []
    for url in urls:
        url = url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"endpoint {url!r} is not an http(s) URL like http://10.0.0.5:8000")
        endpoints.append(Endpoint(id=url, name=parts.netloc, url=url, routable=True))
    return endpoints


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Ready as kubelet computes it: its containers ready (ContainersReady)
    and every readiness gate True, shoal's warm-up gate among them. Not the
    Ready condition itself: kube-controller-manager also sets that False,
    and nothing else, on every pod of a node it has not heard from for
    node-monitor-grace-period, a node cut off from the control plane or a
    control plane away that long. The engines still serve then, and the
    router's own requests (breaker, retries) tell whether one does not; a
    router that dropped them all answered 503 until kubelet wrote Ready again
    (45 s on the real node after a 22 s API server restart)."""
    conditions = {
        str(c.get("type")): str(c.get("status")) == "True"
        for c in pod.get("status", {}).get("conditions") or []
    }
    if "ContainersReady" not in conditions:  # not written by this kubelet: Ready's word
        return conditions.get("Ready", False)
    gates = [g.get("conditionType") for g in pod.get("spec", {}).get("readinessGates") or []]
    return conditions["ContainersReady"] and all(conditions.get(g, False) for g in gates)


def pod_endpoint(pod: dict[str, Any], *, engine_port: int) -> Endpoint | None:
    """A pod as an endpoint; None until it has an IP."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    ip = status.get("podIP")
    if not ip:
        return None
    routable = (
        pod_ready(pod) and not meta.get("deletionTimestamp") and status.get("phase") == "Running"
    )
    host = f"[{ip}]" if ":" in ip else ip
    return Endpoint(
        id=meta["uid"],
        name=meta["name"],
        url=f"http://{host}:{engine_port}",
        routable=bool(routable),
    )


class PodWatcher:
    """Lists and watches pods and publishes the full endpoint list on every
    change, until cancelled."""

    def __init__(
        self,
        *,
        namespace: str,
        selector: str,
        engine_port: int,
        publish: Publish,
        watch_timeout_seconds: int = 300,
        kubeconfig: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.selector = selector
        self.engine_port = engine_port
        self.publish = publish
        self.watch_timeout_seconds = watch_timeout_seconds
        self.kubeconfig = kubeconfig
        self.relists = 0

    def _emit(self, pods: dict[str, dict[str, Any]]) -> None:
        endpoints = [
            e for p in pods.values() if (e := pod_endpoint(p, engine_port=self.engine_port))
        ]
        self.publish(endpoints)

    async def run(self) -> None:
        api: kr8s.asyncio.Api | None = None
        backoff = 0.5
        while True:
            try:
                if api is None:
                    api = await connect(kubeconfig=self.kubeconfig)
                pods, version = await self._list(api)
                self.relists += 1
                self._emit(pods)
                backoff = 0.5
                await self._watch(api, pods, version)
            except Exception as error:
                log.warning("pod watch failed, re-listing in %.1fs: %s", backoff, error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _list(self, api: kr8s.asyncio.Api) -> tuple[dict[str, dict[str, Any]], str]:
        async with api.call_api(
            "GET",
            version=Pod.version,
            namespace=self.namespace,
            url=Pod.endpoint,
            params={"labelSelector": self.selector},
            headers=HEADERS,
            timeout=LIST_TIMEOUT,
        ) as response:
            listing = response.json()
        pods = {p["metadata"]["uid"]: p for p in listing["items"]}
        return pods, listing["metadata"]["resourceVersion"]

    async def _watch(
        self, api: kr8s.asyncio.Api, pods: dict[str, dict[str, Any]], version: str
    ) -> None:
        """Follow changes from the list's version until the watch ends (the
        server's timeout) or reports an error (410 Gone when it expired)."""
        params = {
            "labelSelector": self.selector,
            "watch": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(self.watch_timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        async with api.call_api(
            "GET",
            version=Pod.version,
            namespace=self.namespace,
            url=Pod.endpoint,
            params=params,
            headers=HEADERS,
            stream=True,
            # The server ends the watch; this only catches one gone silent.
            timeout=httpx.Timeout(LIST_TIMEOUT.connect, read=self.watch_timeout_seconds + 30.0),
        ) as response:
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                kind, raw = event["type"], event["object"]
                if kind == "ERROR":
                    log.info("pod watch error, re-listing: %s", raw.get("message"))
                    return
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    pods.pop(raw["metadata"]["uid"], None)
                else:
                    pods[raw["metadata"]["uid"]] = raw
                self._emit(pods)
