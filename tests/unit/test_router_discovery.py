"""Which pods the router routes to (`pod_endpoint`), from their status as
kubelet, kube-controller-manager and shoal's operator write it."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.controller.names import CONDITION_WARMED
from shoal.router.discovery import pod_endpoint


def _pod(*, ready: str, containers: str | None, gate: str | None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready}]
    if containers is not None:
        conditions.append({"type": "ContainersReady", "status": containers})
    spec: dict[str, Any] = {}
    if gate is not None:
        spec["readinessGates"] = [{"conditionType": CONDITION_WARMED}]
        conditions.append({"type": CONDITION_WARMED, "status": gate})
    return {
        "metadata": {"name": "eng-0", "uid": "u0"},
        "spec": spec,
        "status": {"phase": "Running", "podIP": "10.0.0.5", "conditions": conditions},
    }


@pytest.mark.parametrize(
    ("ready", "containers", "gate", "routable"),
    [
        ("True", "True", "True", True),  # kubelet's Ready: containers and gate
        # kube-controller-manager's MarkPodsNotReady (its node unheard from for
        # node-monitor-grace-period) writes Ready False and nothing else.
        ("False", "True", "True", True),
        ("False", "True", "False", False),  # shoal's gate: not warmed, or out for its health
        ("False", "False", "True", False),  # kubelet: a container not ready
        ("True", "True", None, True),  # no gate in its spec
        ("False", "True", None, True),
        ("False", None, None, False),  # no ContainersReady written: Ready's word
        ("True", None, None, True),
    ],
)
def test_a_pod_is_routable_on_kubelets_and_shoals_word(
    ready: str, containers: str | None, gate: str | None, routable: bool
) -> None:
    pod = _pod(ready=ready, containers=containers, gate=gate)
    endpoint = pod_endpoint(pod, engine_port=8000)
    assert endpoint is not None and endpoint.routable is routable


def test_a_gate_not_yet_written_keeps_the_pod_out() -> None:
    pod = _pod(ready="False", containers="True", gate="True")
    pod["status"]["conditions"] = [
        c for c in pod["status"]["conditions"] if c["type"] != CONDITION_WARMED
    ]
    endpoint = pod_endpoint(pod, engine_port=8000)
    assert endpoint is not None and not endpoint.routable


def test_a_terminating_or_finished_pod_is_not_routable() -> None:
    deleting = _pod(ready="True", containers="True", gate="True")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    finished = _pod(ready="False", containers="False", gate="True")
    finished["status"]["phase"] = "Succeeded"
    for pod in (deleting, finished):
        endpoint = pod_endpoint(pod, engine_port=8000)
        assert endpoint is not None and not endpoint.routable
