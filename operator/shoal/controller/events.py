"""The Events shoal posts on a VLLMCluster, as the API server stores them
(core v1). Pure.

Why shoal builds and posts them itself, not through kopf.event: kopf queues
an Event and posts it in the background while the pass goes on, so an
operator killed just after it acted lost the Event, and a restarted one sees
the result (a replica that exists) with nothing left to say about it (issue
18). The reconciler awaits each Event before the action it announces
(`reconcile`): a pass killed after the Event but before the action decides
the action again and announces it again (said twice, done once), and
nothing done goes unannounced. Messages are therefore worded as what is
being done ("creating replica 1")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.api import API_VERSION, KIND
from shoal.controller.decide import Event
from shoal.controller.identity import ClusterRef, Manifest

# `kubectl describe`'s "From" column, and the Events' name prefix.
REPORTING_COMPONENT = "shoal-operator"
NAME_PREFIX = "shoal-"
# The API server takes longer messages, kubectl's columns do not; kopf's limit.
MAX_MESSAGE = 1024
_CUT = "..."


def shortened(message: str) -> str:
    """At most MAX_MESSAGE characters, keeping both ends (the end often says why)."""
    if len(message) <= MAX_MESSAGE:
        return message
    keep = MAX_MESSAGE - len(_CUT)
    return message[: keep // 2] + _CUT + message[-(keep - keep // 2) :]


def event_manifest(ref: ClusterRef, event: Event, *, now: str, instance: str) -> Manifest:
    """The core v1 Event on the cluster; now: RFC 3339 seconds; instance:
    which operator process (its host name) said it."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": NAME_PREFIX, "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        },
        "type": str(event.type),
        "reason": event.reason,
        "message": shortened(event.message),
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def children_made(status: Mapping[str, Any]) -> bool:
    """Whether an earlier pass, perhaps of an earlier operator process, made
    the cluster's children: it wrote status and no child write was refused.
    Then a child found missing was deleted, and its ChildRestored Event is
    due even from a process that did not make it."""
    if status.get("observedGeneration") is None:
        return False
    reasons = {condition.get("reason") for condition in status.get("conditions") or []}
    return not reasons & {"ChildRefused", "ReconcileFailed"}
