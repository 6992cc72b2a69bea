"""A cluster's router pods read each other's placements as the operator
deploys them (spec.router.sharePlacements, on by default): each finds the
others by label through the API server, leaves itself out by its pod name
(POD_NAME from the downward API), and reads their internal port."""

from __future__ import annotations

import functools

import httpx
import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import MODEL, children, cluster_manifest, wait_ready

pytestmark = pytest.mark.e2e

PATTERN = "shoal-peers"


def _router_urls(bed: Testbed, ns: str, name: str) -> list[str]:
    urls = []
    for pod in children(bed, ns, name, "pods"):
        ip = pod.get("status", {}).get("podIP")
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == "router" and ip:
            urls.append(f"http://{ip}:8000")
    return sorted(urls)


def _following_one(url: str) -> bool:
    return _metric(url, "shoal_router_peers") == 1.0


def _metric(url: str, name: str) -> float | None:
    try:
        text = httpx.get(url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_router_pods_follow_each_other_and_read_placements(testbed: Testbed, ns: str) -> None:
    apply(testbed, ns, cluster_manifest("peers", replicas=2, tensor=4))
    wait_ready(testbed, ns, "peers", 2)

    def both() -> list[str] | None:
        urls = _router_urls(testbed, ns, "peers")
        return urls if len(urls) == 2 else None

    routers = wait_for(both, what="two router pods with IPs", timeout=60)
    wait_for(lambda: all(map(_ready, routers)), what="both routers Ready", timeout=90)
    # Each follows the other, not itself.
    for url in routers:
        wait_for(
            functools.partial(_following_one, url),
            what=f"{url} following its one peer",
            timeout=60,
        )
    first, second = routers
    for i in range(6):
        response = httpx.post(
            first + "/v1/completions",
            json={"model": MODEL, "prompt": f"Conversation {i}. " * 12, "max_tokens": 2},
            timeout=30,
        )
        assert response.status_code == 200, response.text

    def read_all() -> float | None:
        read = _metric(second, "shoal_router_peer_placements_total")
        return read if read is not None and read >= 6 else None

    read = wait_for(
        read_all,
        what="the second router reading the first one's placements",
        timeout=30,
    )
    assert read == 6, read
