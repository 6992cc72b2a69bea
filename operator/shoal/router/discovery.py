"""Where the replicas are: a static list, or the VLLMCluster's leader pods.

Kubernetes mode lists and watches pods by label in one namespace (the
router's Role may only get, list and watch pods), on the event loop through
kr8s (`shoal.apiserver`). A pod is routable only while running, not
terminating, and ready as kubelet and shoal say (`pod_ready`); a terminated
one (`pod_terminated`) is no endpoint at all, engine or peer router. Any watch
error or expiry leads to a fresh list, and the fleet is replaced by what the
list says, so no pod the API no longer has is kept. Watches last a minute,
and one silent past that is taken for a dead connection. That list comes at once
after a watch that was up (`watch_was_up`); while lists or watches fail or end
at once, ever later (`relist_delay`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
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
# A failing list or watch: the first and the longest wait before the next list.
RELIST_SECONDS = (0.5, 30.0)
# A watch up this long worked, though it delivered nothing: a quiet fleet.
WATCH_UP_SECONDS = 10.0
# The server ends each watch after this long (timeoutSeconds), and a list follows.
WATCH_SECONDS = 60
# A watch silent this much longer than that is a dead connection (a partition
# sends nothing, not even the watch's end): it is given up and the pods listed.
WATCH_SILENT_FACTOR = 1.25


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


def pod_terminated(pod: Mapping[str, Any]) -> bool:
    """All its containers ended for good: it never serves again. Since
    Kubernetes 1.22 an evicted pod stays, Failed, with its IP in its status
    until it is deleted (the pod garbage collector waits for 12,500 by
    default), while the IP goes to another pod: an endpoint for it would send
    requests and the API key there, and a peer of that IP could be this
    router itself."""
    phase = pod.get("status", {}).get("phase")
    return phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)


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
    """A pod as an endpoint; None until it has an IP, and once it terminated."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    ip = status.get("podIP")
    if not ip or pod_terminated(pod):
        return None
    routable = (
        pod_ready(pod)
        and not meta.get("deletionTimestamp")
        and status.get("phase") == PodPhase.RUNNING
    )
    host = f"[{ip}]" if ":" in ip else ip
    return Endpoint(
        id=meta["uid"],
        name=meta["name"],
        url=f"http://{host}:{engine_port}",
        routable=bool(routable),
    )


def pod_endpoints(pods: Iterable[dict[str, Any]], *, port: int) -> list[Endpoint]:
    """The pods that are endpoints, serving on `port`."""
    return [e for p in pods if (e := pod_endpoint(p, engine_port=port))]


def peer_urls(routers: Iterable[Endpoint], *, own_pod: str | None) -> list[str]:
    """The other router replicas' URLs: every router pod listed but this one."""
    return [r.url for r in routers if r.name != own_pod]


@dataclass(frozen=True)
class WatchEnd:
    """How a watch ended: after how many events (bookmarks too) and seconds,
    and the error that ended it, if one did."""

    events: int
    seconds: float
    error: Exception | None = None


def watch_was_up(*, events: int, seconds: float, timeout: float) -> bool:
    """A watch that delivered events or lasted worked, however it ended; one
    that ended at once without any (a 429 from the API server's priority and
    fairness, a proxy cutting streams) did not, and a list at once would only
    repeat it. Lasting is WATCH_UP_SECONDS, or half a shorter server timeout."""
    return events > 0 or seconds >= min(WATCH_UP_SECONDS, timeout / 2)


def relist_delay(failures: int, *, jitter: float) -> float:
    """Seconds before the next list after `failures` lists or watches in a row
    that failed or ended at once: doubling up to the longest, less up to half
    at random (`jitter` in [0, 1)), so that routers that failed together
    (an API server restart) do not come back in step."""
    first, longest = RELIST_SECONDS
    return min(first * 2.0 ** min(failures, 32), longest) * (1 - jitter / 2)


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
        watch_timeout_seconds: int = WATCH_SECONDS,
        kubeconfig: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.namespace = namespace
        self.selector = selector
        self.engine_port = engine_port
        self.publish = publish
        self.watch_timeout_seconds = watch_timeout_seconds
        self.kubeconfig = kubeconfig
        self.relists = 0
        self.rng = rng or random.Random()

    def _emit(self, pods: dict[str, dict[str, Any]]) -> None:
        self.publish(pod_endpoints(pods.values(), port=self.engine_port))

    async def run(self) -> None:
        api: kr8s.asyncio.Api | None = None
        failures = 0  # lists and watches in a row that failed or ended at once
        while True:
            try:
                if api is None:
                    api = await connect(kubeconfig=self.kubeconfig)
                pods, version = await self._list(api)
                self.relists += 1
                self._emit(pods)
            except Exception as error:
                problem = f"list failed: {error}"
            else:
                end = await self._watch(api, pods, version)
                timeout = self.watch_timeout_seconds
                if watch_was_up(events=end.events, seconds=end.seconds, timeout=timeout):
                    failures = 0
                    if end.error is None:
                        continue  # its timeout, or a 410 once the list is stale: list now
                problem = f"watch failed: {end.error}" if end.error else "watch ended at once"
            delay = relist_delay(failures, jitter=self.rng.random())
            failures += 1
            log.warning("pod %s; re-listing in %.1fs", problem, delay)
            await asyncio.sleep(delay)

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
    ) -> WatchEnd:
        """Follow changes from the list's version until the watch ends."""
        loop = asyncio.get_running_loop()
        started, events = loop.time(), 0
        try:
            async for event in self._events(api, version):
                events += 1
                kind, raw = event["type"], event["object"]
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    pods.pop(raw["metadata"]["uid"], None)
                else:
                    pods[raw["metadata"]["uid"]] = raw
                self._emit(pods)
        except Exception as error:
            return WatchEnd(events=events, seconds=loop.time() - started, error=error)
        return WatchEnd(events=events, seconds=loop.time() - started)

    async def _events(self, api: kr8s.asyncio.Api, version: str) -> AsyncIterator[dict[str, Any]]:
        """The watch's events from `version` until it ends (the server's
        timeout) or reports an error (410 Gone when it expired)."""
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
            timeout=httpx.Timeout(
                LIST_TIMEOUT.connect, read=self.watch_timeout_seconds * WATCH_SILENT_FACTOR
            ),
        ) as response:
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    log.info("pod watch error, re-listing: %s", event["object"].get("message"))
                    return
                yield event
