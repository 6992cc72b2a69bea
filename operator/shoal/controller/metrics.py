"""The operator's own Prometheus metrics (`shoal_operator_*`), each labelled
with the VLLMCluster's `namespace` and `vllmcluster` (the chart's
ServiceMonitor honours them, so they are not renamed to exported_namespace):

- reconcile passes by result and their time;
- every Event it posts by type and reason, which counts what an operator of
  the fleet wants to see over time: restarts (`ReplicaRestarted`), warm-ups
  (`Warmed`, `WarmupTimedOut`, `WarmupHeld`), lost nodes (`NodeLost`),
  refused specs (`InvalidSpec`); the reasons alerts and the dashboard watch
  start at 0 for each cluster, so the first one is an increase Prometheus can see;
- per cluster, desired/ready/warm replicas and each condition's status and
  reason, as the last status written says (kube-state-metrics' style: one
  series per condition with value 1, for its current status and reason);
- whether this operator acts (holds its Lease) or stands by.

A cluster no longer watched has its series removed (`forget`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shoal.controller.decide import Event, EventReason, EventType, GateReason

PostEvent = Callable[[Any, Event], None]  # in the background
ClusterKey = tuple[str, str]  # (namespace, name)

CLUSTER_LABELS = ("namespace", "vllmcluster")


class ReplicaCount(StrEnum):
    DESIRED = "desired"
    READY = "ready"
    WARM = "warm"


# The status field each count reads (desired is the spec's, see observe_cluster).
_STATUS_COUNTS = {ReplicaCount.READY: "readyReplicas", ReplicaCount.WARM: "warmReplicas"}
# Reasons the chart's alerts and dashboard compute increase() on: present at
# 0 from a cluster's first pass, else the first Event makes a series with no
# earlier sample, which increase() never sees (and a panel shows no data).
COUNTED_FROM_ZERO = (
    (EventType.WARNING, EventReason.REPLICA_RESTARTED),
    (EventType.WARNING, GateReason.WARMUP_TIMED_OUT),
    (EventType.WARNING, EventReason.NODE_LOST),
)


class PassResult(StrEnum):
    """How a reconcile pass ended (the passes counter's `result`)."""

    OK = "ok"
    ERROR = "error"


@dataclass
class _Seen:
    """The label sets a cluster's series were last given (to remove them)."""

    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    events: set[tuple[str, str]] = field(default_factory=set)
    results: set[str] = field(default_factory=set)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.passes = Counter(
            "shoal_operator_reconcile_passes",
            "Reconcile passes of a VLLMCluster, by result (ok or error).",
            [*CLUSTER_LABELS, "result"],
            registry=self.registry,
        )
        self.pass_seconds = Histogram(
            "shoal_operator_reconcile_seconds",
            "Time of one reconcile pass of a VLLMCluster.",
            CLUSTER_LABELS,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.events = Counter(
            "shoal_operator_events",
            "Events posted on VLLMClusters, by type and reason.",
            [*CLUSTER_LABELS, "type", "reason"],
            registry=self.registry,
        )
        self.replicas = Gauge(
            "shoal_operator_cluster_replicas",
            "Replicas of a VLLMCluster: desired (spec.replicas), ready (engine up) "
            "and warm (serving, warm-up passed), as its status says.",
            [*CLUSTER_LABELS, "state"],
            registry=self.registry,
        )
        self.conditions = Gauge(
            "shoal_operator_cluster_condition",
            "A VLLMCluster's condition: 1 for its current status and reason.",
            [*CLUSTER_LABELS, "condition", "status", "reason"],
            registry=self.registry,
        )
        self.leading = Gauge(
            "shoal_operator_leading",
            "1 while this operator acts: it holds its Lease (or runs without one); "
            "0 while it stands by.",
            registry=self.registry,
        )
        self._seen: dict[ClusterKey, _Seen] = {}

    def counting(self, post: PostEvent) -> PostEvent:
        """post_event that also counts the Event."""

        def post_and_count(body: Any, event: Event) -> None:
            self.event_posted(body, event)
            post(body, event)

        return post_and_count

    def event_posted(self, body: Any, event: Event) -> None:
        """Count an Event on the cluster body."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        self._count_event(key, str(event.type), event.reason)

    def _count_event(self, key: ClusterKey, kind: str, reason: str, by: float = 1) -> None:
        self._seen.setdefault(key, _Seen()).events.add((kind, reason))
        self.events.labels(*key, kind, reason).inc(by)

    def pass_finished(self, key: ClusterKey, *, ok: bool, seconds: float) -> None:
        results = self._seen.setdefault(key, _Seen()).results
        if not results:
            # Both from 0: "no successful pass" is an increase of 0, not a
            # series missing (which alerts on nothing).
            for each in PassResult:
                self.passes.labels(*key, each).inc(0)
                results.add(each)
        self.passes.labels(*key, PassResult.OK if ok else PassResult.ERROR).inc()
        self.pass_seconds.labels(*key).observe(seconds)

    def observe_cluster(self, key: ClusterKey, *, desired: int, status: Mapping[str, Any]) -> None:
        """The replica counts and conditions of the status just built."""
        seen = self._seen.setdefault(key, _Seen())
        for event_type, reason in COUNTED_FROM_ZERO:
            if (str(event_type), reason) not in seen.events:
                self._count_event(key, str(event_type), reason, by=0)
        self.replicas.labels(*key, ReplicaCount.DESIRED).set(desired)
        for count, name in _STATUS_COUNTS.items():
            self.replicas.labels(*key, count).set(int(status.get(name) or 0))
        for condition in status.get("conditions") or []:
            kind = str(condition.get("type", ""))
            current = (str(condition.get("status", "")), str(condition.get("reason", "")))
            previous = seen.conditions.get(kind)
            if previous is not None and previous != current:
                self.conditions.remove(*key, kind, *previous)
            self.conditions.labels(*key, kind, *current).set(1)
            seen.conditions[kind] = current

    def forget(self, key: ClusterKey) -> None:
        """Remove a deleted (or no longer watched) cluster's series."""
        seen = self._seen.pop(key, None)
        if seen is None:
            return
        for result in seen.results:
            self.passes.remove(*key, result)
        self.pass_seconds.remove(*key)  # remove() ignores label sets never made
        for kind, reason in seen.events:
            self.events.remove(*key, kind, reason)
        for count in ReplicaCount:
            self.replicas.remove(*key, count)
        for kind, current in seen.conditions.items():
            self.conditions.remove(*key, kind, *current)


__all__ = ["COUNTED_FROM_ZERO", "OperatorMetrics", "ReplicaCount"]
