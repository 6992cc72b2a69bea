"""API keys through the operator: spec.router.apiKeySecret names a Secret whose
key holds accepted keys, one per line; the operator mounts it in the router pod
and passes the file's path as `--api-key-file` (the pod runner moves it to the
Secret's files, as kubelet mounts them). Requests through the router pod then
need `Authorization: Bearer <one of the keys>`. When the Secret changes, the
pod runner updates the mounted file as kubelet does (a `..data` symlink swap)
and the running router takes the new keys up without a restart."""

from __future__ import annotations

import httpx
import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import MODEL, children, cluster_manifest, wait_ready

pytestmark = pytest.mark.e2e

PATTERN = "shoal-keys"
BODY = {"model": MODEL, "prompt": "who goes there", "max_tokens": 2}


def _secret(keys: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "router-keys"},
        "type": "Opaque",
        "stringData": {"keys.txt": keys},
    }


def _router_pods(bed: Testbed, ns: str, name: str) -> dict[str, str]:
    """uid -> URL of the cluster's router pods that have an IP."""
    found = {}
    for pod in children(bed, ns, name, "pods"):
        ip = pod.get("status", {}).get("podIP")
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == "router" and ip:
            found[pod["metadata"]["uid"]] = f"http://{ip}:8000"
    return found


def _ready_router(bed: Testbed, ns: str, name: str) -> tuple[str, str]:
    """(uid, URL) of a router pod answering /ready (health endpoints need no
    key)."""

    def probe() -> tuple[str, str] | None:
        for uid, url in _router_pods(bed, ns, name).items():
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    return uid, url
            except httpx.HTTPError:
                pass
        return None

    return wait_for(probe, what=f"{name}'s router answering /ready", timeout=90)


def _post(url: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url + "/v1/completions", json=BODY, headers=headers, timeout=30)


def test_the_router_requires_one_of_the_keys_in_the_clusters_secret(
    testbed: Testbed, ns: str
) -> None:
    apply(testbed, ns, _secret("sk-alpha-0001\nsk-bravo-0002\n"))
    spec = cluster_manifest(
        "keyed",
        replicas=1,
        tensor=4,
        router={"apiKeySecret": {"name": "router-keys", "key": "keys.txt"}},
    )
    apply(testbed, ns, spec)
    wait_ready(testbed, ns, "keyed", 1)
    uid, url = _ready_router(testbed, ns, "keyed")

    missing = _post(url, None)
    assert missing.status_code == 401
    error = missing.json()["error"]
    assert error["type"] == "AuthenticationError" and error["code"] == 401
    assert error["param"] == "Authorization" and error["message"]
    assert _post(url, "sk-wrong").status_code == 401
    assert _post(url, "sk-alpha-0001x").status_code == 401  # a prefix match is no match
    for key in ("sk-alpha-0001", "sk-bravo-0002"):
        response = _post(url, key)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 2
    # Another scheme carrying a right key is still refused.
    basic = httpx.post(
        url + "/v1/completions",
        json=BODY,
        headers={"Authorization": "Basic sk-alpha-0001"},
        timeout=30,
    )
    assert basic.status_code == 401

    # Rotation: the same router pod takes the new keys up once the mounted
    # file changes (the pod runner's volume sync, then the router's
    # apiKeyReloadSeconds, 10 s by default), and refuses the old ones.
    apply(testbed, ns, _secret("sk-charlie-0003\n"))
    wait_for(
        lambda: _post(url, "sk-charlie-0003").status_code == 200,
        what="the rotated key accepted by the running router",
        timeout=60,
    )
    assert _post(url, "sk-alpha-0001").status_code == 401
    assert _post(url, None).status_code == 401
    assert uid in _router_pods(testbed, ns, "keyed"), "the router pod was replaced"
