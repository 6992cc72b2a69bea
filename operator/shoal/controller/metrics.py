"""The operator's own Prometheus metrics (`shoal_operator_*`): reconcile
passes and their time, and every Event it posts by reason, which counts what
an operator of the fleet wants to see over time: restarts
(`ReplicaRestarted`), warm-ups (`Warmed`, `WarmupTimedOut`, `WarmupHeld`),
lost nodes (`NodeLost`), refused specs (`InvalidSpec`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from shoal.controller.decide import Event

PostEvent = Callable[[Any, Event], None]


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.passes = Counter(
            "shoal_operator_reconcile_passes",
            "Reconcile passes, by result (ok or error).",
            ["result"],
            registry=self.registry,
        )
        self.pass_seconds = Histogram(
            "shoal_operator_reconcile_seconds",
            "Time of one reconcile pass.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.events = Counter(
            "shoal_operator_events",
            "Events posted on VLLMClusters, by type and reason.",
            ["type", "reason"],
            registry=self.registry,
        )

    def counting(self, post: PostEvent) -> PostEvent:
        """post_event that also counts the Event."""

        def post_and_count(body: Any, event: Event) -> None:
            self.events.labels(event.type, event.reason).inc()
            post(body, event)

        return post_and_count
