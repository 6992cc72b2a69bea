"""Whether a pod is ready, for every shoal process that reads pods (the
router's discovery, the operator's observations): one definition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
