"""The router's Kubernetes discovery against the real API server: a pod is
routable only while Ready (readiness gate included), is dropped when it turns
not-Ready or is deleted, and the router recovers after its watch breaks."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal.procs import http_status, start_router
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, namespace, pods, wait_for

pytestmark = pytest.mark.e2e

WARMED = "serving.shoal.dev/warmed"


def _healthy(url: str) -> bool:
    return http_status(url) == 200


def engines(replicas: int) -> dict[str, Any]:
    labels = {"app": "eng"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "eng"},
        "spec": {
            "replicas": replicas,
            "serviceName": "eng",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "readinessGates": [{"conditionType": WARMED}],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "args": [
                                "--served-model-name",
                                "m",
                                "--port",
                                "8000",
                                "--sim-time-scale",
                                "20",
                            ],
                        }
                    ],
                },
            },
        },
    }


def set_gate(bed: Testbed, ns: str, pod: str, status: str) -> None:
    patch = f'{{"status":{{"conditions":[{{"type":"{WARMED}","status":"{status}"}}]}}}}'
    bed.kubectl(
        "patch", "pod", pod, "-n", ns, "--subresource=status", "--type=strategic", "-p", patch
    )


@contextmanager
def router_process(bed: Testbed, ns: str, tmp: Path) -> Iterator[str]:
    """A router that discovers the `app=eng` pods of ns through the API server."""
    discovery = [
        "--kubernetes",
        "--namespace",
        ns,
        "--selector",
        "app=eng",
        "--engine-port",
        "8000",
    ]
    with start_router(
        log=tmp / "router.log",
        # A new pod is Ready a moment before its simulator listens; its first
        # request may fail and open the breaker. Under the test's 30 s wait.
        config={
            "policy": "round-robin",
            "circuitBreaker": {"openSeconds": 5},
            "replicaHeader": True,
        },
        args=discovery,
        env={**os.environ, "KUBECONFIG": str(bed.kubeconfig)},
        log_level="INFO",
    ) as router:
        # /health, not /ready: no pod is routable yet.
        router.wait_http("/health", timeout=20)
        yield router.url


def _uid(bed: Testbed, ns: str, pod: str) -> str:
    jsonpath = "jsonpath={.metadata.uid}"
    return bed.kubectl("get", "pod", pod, "-n", ns, "-o", jsonpath, check=False).strip()


def placements(url: str, count: int) -> list[str]:
    placed = []
    with httpx.Client(timeout=10) as client:
        for i in range(count):
            r = client.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": f"hello {i}", "max_tokens": 2},
            )
            placed.append(r.headers.get("x-shoal-replica", f"HTTP {r.status_code}"))
    return placed


def test_router_routes_only_to_ready_pods_and_survives_a_broken_watch(
    testbed: Testbed, tmp_path: Path
) -> None:
    with namespace(testbed, "disc") as ns:
        apply(testbed, ns, engines(2))

        def with_ips() -> list[dict[str, Any]] | None:
            found = pods(testbed, ns, "app=eng")
            with_ip = [x for x in found if x["status"].get("podIP")]
            return with_ip if len(with_ip) == len(found) == 2 else None

        running = wait_for(with_ips, what="2 engine pods with IPs")
        for pod in running:
            ip = pod["status"]["podIP"]
            wait_for(
                functools.partial(_healthy, f"http://{ip}:8000/health"),
                what=f"simulator at {ip}",
                timeout=30,
            )
        with router_process(testbed, ns, tmp_path) as url:
            # Engines answer, but their warm-up gate is not set: nothing routable.
            assert http_status(url + "/ready") == 503
            assert placements(url, 1) == ["HTTP 503"]

            set_gate(testbed, ns, "eng-0", "True")
            wait_for(lambda: http_status(url + "/ready") == 200, what="eng-0 routable")
            assert set(placements(url, 4)) == {"eng-0"}

            set_gate(testbed, ns, "eng-1", "True")
            wait_for(
                lambda: set(placements(url, 4)) == {"eng-0", "eng-1"},
                what="both replicas in rotation",
            )

            set_gate(testbed, ns, "eng-0", "False")
            wait_for(lambda: set(placements(url, 6)) == {"eng-1"}, what="eng-0 out of rotation")

            # Break every watch, then change the fleet while the router re-lists.
            old_uid = get_json(testbed, "pod", "eng-1", "-n", ns)["metadata"]["uid"]
            testbed.restart_apiserver()
            testbed.kubectl("delete", "pod", "eng-1", "-n", ns, "--wait=true")
            # kube-controller-manager's StatefulSet controller makes the new pod
            # once its informers have re-listed; in one CI run they took ~64 s
            # after the restart (its ServiceAccount informer's relist logged
            # then). The router's own recovery is what the waits below bound.
            wait_for(
                lambda: _uid(testbed, ns, "eng-1") not in ("", old_uid),
                what="eng-1 recreated",
                timeout=150,
            )
            # The new eng-1 is a new, cold replica: not Ready until its gate is set.
            wait_for(
                lambda: http_status(url + "/ready") == 503,
                what="router drops deleted eng-1",
                timeout=30,
            )
            # Its gate set once its simulator answers, as the operator does (and
            # as for the first pods above): the testbed's start of the process,
            # slow after the restart in one CI run, is not the router's to bound.
            new_ip = wait_for(
                lambda: get_json(testbed, "pod", "eng-1", "-n", ns)["status"].get("podIP"),
                what="the new eng-1's IP",
                timeout=150,
            )
            wait_for(
                functools.partial(_healthy, f"http://{new_ip}:8000/health"),
                what=f"the new eng-1's simulator at {new_ip}",
                timeout=150,
            )
            set_gate(testbed, ns, "eng-1", "True")
            wait_for(
                lambda: set(placements(url, 4)) == {"eng-1"},
                what="the new eng-1 routable",
                timeout=30,
            )
