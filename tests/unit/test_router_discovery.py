"""Which pods the router routes to (`pod_endpoint`), from their status as
kubelet, kube-controller-manager and shoal's operator write it, and which
router pods it reads placements from (`peer_urls`): a terminated pod (evicted,
Failed or Succeeded, which keeps its IP) is neither."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.controller.names import CONDITION_WARMED
from shoal.router.discovery import peer_urls, pod_endpoint, pod_endpoints


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


def test_a_terminating_pod_is_not_routable() -> None:
    deleting = _pod(ready="True", containers="True", gate="True")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    endpoint = pod_endpoint(deleting, engine_port=8000)
    assert endpoint is not None and not endpoint.routable


def _terminated(phase: str, *, name: str, ip: str) -> dict[str, Any]:
    """A pod that ran and ended: since Kubernetes 1.22 an evicted one stays
    Failed, with its IP, until it is deleted."""
    pod = _pod(ready="False", containers="False", gate="True")
    pod["metadata"] = {"name": name, "uid": f"uid-{name}"}
    pod["status"].update(phase=phase, podIP=ip)
    if phase == "Failed":
        pod["status"]["reason"] = "Evicted"
    return pod


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_terminated_pod_is_no_endpoint_though_it_keeps_its_ip(phase: str) -> None:
    assert pod_endpoint(_terminated(phase, name="eng-0", ip="10.0.0.5"), engine_port=8000) is None


def test_only_live_router_pods_other_than_this_one_are_peers() -> None:
    """An evicted router's IP may be given to any pod, this router among
    them: a reader of it would send the API key there, or count this
    router's own pending prefill twice."""
    me = _pod(ready="True", containers="True", gate=None)
    me["metadata"] = {"name": "router-a", "uid": "uid-a"}
    other = _pod(ready="True", containers="True", gate=None)
    other["metadata"] = {"name": "router-b", "uid": "uid-b"}
    other["status"]["podIP"] = "10.0.0.6"
    evicted = _terminated("Failed", name="router-old", ip="10.0.0.7")
    done = _terminated("Succeeded", name="router-older", ip="10.0.0.5")  # now my IP
    routers = pod_endpoints([me, other, evicted, done], port=9090)
    assert peer_urls(routers, own_pod="router-a") == ["http://10.0.0.6:9090"]
