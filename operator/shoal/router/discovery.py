"""Where the replicas are: a static list, or the VLLMCluster's leader pods.

Kubernetes mode lists and watches pods by label in one namespace (the
router's Role may only get, list and watch pods). A pod is routable only while
it is Ready (which includes shoal's warm-up readiness gate) and not
terminating. Any watch error or expiry leads to a fresh list, and the fleet is
replaced by what the list says, so no pod the API no longer has is kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from shoal.router.fleet import Endpoint

log = logging.getLogger("shoal.router.discovery")

Publish = Callable[[list[Endpoint]], None]


def static_endpoints(urls: Sequence[str]) -> list[Endpoint]:
    endpoints = []
    for url in urls:
        url = url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"endpoint {url!r} is not an http(s) URL like http://10.0.0.5:8000")
        endpoints.append(Endpoint(id=url, name=parts.netloc, url=url, routable=True))
    return endpoints


def pod_endpoint(pod: dict[str, Any], *, engine_port: int) -> Endpoint | None:
    """A pod as an endpoint; None until it has an IP."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    ip = status.get("podIP")
    if not ip:
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    routable = ready and not meta.get("deletionTimestamp") and status.get("phase") == "Running"
    host = f"[{ip}]" if ":" in ip else ip
    return Endpoint(
        id=meta["uid"],
        name=meta["name"],
        url=f"http://{host}:{engine_port}",
        routable=bool(routable),
    )


class PodWatcher:
    """Lists and watches pods in a thread (the kubernetes client is
    synchronous) and publishes the full endpoint list to the event loop."""

    def __init__(
        self,
        *,
        namespace: str,
        selector: str,
        engine_port: int,
        loop: asyncio.AbstractEventLoop,
        publish: Publish,
        watch_timeout_seconds: int = 300,
    ) -> None:
        self.namespace = namespace
        self.selector = selector
        self.engine_port = engine_port
        self.loop = loop
        self.publish = publish
        self.watch_timeout_seconds = watch_timeout_seconds
        self.stop_event = threading.Event()
        self.relists = 0
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def _emit(self, pods: dict[str, dict[str, Any]]) -> None:
        endpoints = [
            e for p in pods.values() if (e := pod_endpoint(p, engine_port=self.engine_port))
        ]
        self.loop.call_soon_threadsafe(self.publish, endpoints)

    def _run(self) -> None:
        from kubernetes import client, config, watch

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api = client.CoreV1Api()
        backoff = 0.5
        while not self.stop_event.is_set():
            try:
                response: Any = api.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, _preload_content=False
                )
                listing = json.loads(response.data)
                pods = {p["metadata"]["uid"]: p for p in listing["items"]}
                self.relists += 1
                self._emit(pods)
                backoff = 0.5
                stream = watch.Watch().stream(
                    api.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=self.watch_timeout_seconds,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if self.stop_event.is_set():
                        return
                    kind, raw = event["type"], event["raw_object"]
                    if kind == "ERROR":
                        log.info("pod watch error, re-listing: %s", raw.get("message"))
                        break
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        pods.pop(raw["metadata"]["uid"], None)
                    else:
                        pods[raw["metadata"]["uid"]] = raw
                    self._emit(pods)
            except Exception as error:
                log.warning("pod watch failed, re-listing in %.1fs: %s", backoff, error)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
