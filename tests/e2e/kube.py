"""Small helpers for end-to-end tests against the testbed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import yaml

from shoal.procs import wait_until as wait_for
from shoal_testbed.cluster import Testbed

__all__ = [
    "AFTER_API_RESTART_SECONDS",
    "apply",
    "condition",
    "get_json",
    "namespace",
    "pod_if",
    "pods",
    "wait_for",
]

# How long the testbed's client-go components (kube-scheduler, kwok) may take
# to see a new object after an API server restart. Each failed list or watch
# during the outage doubles a reflector's backoff, capped at 30 s and then
# jittered by up to 100%: its next try can come a minute after the API server
# is back. (Seen in CI: kwok's Logs informer retried 60 s after the restart,
# so a pod created then had no logs served for 57 s.)
AFTER_API_RESTART_SECONDS = 150


def get_json(bed: Testbed, *args: str) -> Any:
    return json.loads(bed.kubectl("get", *args, "-o", "json"))


def apply(bed: Testbed, namespace: str, *manifests: dict[str, Any]) -> None:
    bed.kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(manifests))


@contextmanager
def namespace(bed: Testbed, prefix: str) -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", name)
    wait_for(
        lambda: bed.kubectl("get", "serviceaccount", "default", "-n", name, check=False),
        what=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        bed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def pods(bed: Testbed, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(bed, "pods", "-n", namespace, "-l", selector)["items"]
    return items


def pod_if(
    bed: Testbed, namespace: str, name: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    """The pod, if it satisfies predicate (for wait_for)."""
    pod: dict[str, Any] = get_json(bed, "pod", name, "-n", namespace)
    return pod if predicate(pod) else None


def run_pod(name: str, script: str, **container: Any) -> dict[str, Any]:
    """A pod whose one container the pod runner plays with `python3 -u -c script`
    (unbuffered: its lines reach the logs as they are printed)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"testbed.shoal.dev/run": "main"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python3", "-u", "-c", script],
                    **container,
                }
            ],
        },
    }
