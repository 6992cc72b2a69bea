"""Pure assessment of probe results: which failures count, and when a replica
has failed often enough in a row to be restarted."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from shoal.health.router_errors import Routed


class Outcome(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"  # no answer within the deadline
    REFUSED = "refused"  # connection-level failure: refused, reset, unreachable
    ERROR = "error"  # an HTTP error status
    SKIPPED = "skipped"


class Reason(StrEnum):
    HEALTHY = "Healthy"
    DEAD = "EngineDead"  # /health refused or 5xx: the engine is gone
    HUNG = "EngineHung"  # the canary timed out and tokens are not moving
    STALLED = "EngineStalled"  # requests running, generated tokens flat
    FAILING = "RequestsFailing"  # the canary or routed requests fail
    METRICS = "MetricsUnavailable"  # the router cannot see its load: out of rotation anyway


@dataclass(frozen=True)
class Probe:
    """One round of checks against one engine."""

    at: float
    health: Outcome
    health_status: int | None = None
    canary: Outcome = Outcome.SKIPPED
    canary_status: int | None = None
    metrics_ok: bool = True
    running: float = 0.0
    # The engine's progress counter: tokens generated plus steps taken (a
    # long prompt's prefill generates nothing for many steps); None if unknown.
    progress: float | None = None
    # Its movement between the canary's start and its deadline (None if unknown).
    progress_during_canary: float | None = None


@dataclass(frozen=True)
class Assessment:
    reason: Reason
    detail: str
    consecutive: int
    threshold: int  # failureThreshold: failed this many checks in a row, restart it
    # /health refused or unanswered: the operator may be the one cut off
    # (packets dropped on its path, its own loop starved), not the engine.
    connection_level: bool

    @property
    def ok(self) -> bool:
        return self.reason is Reason.HEALTHY

    @property
    def unhealthy(self) -> bool:
        return self.unhealthy_after(0)

    def unhealthy_after(self, checks: int) -> bool:
        """Failed threshold checks in a row, not counting the first `checks`
        of this run of failures (those of a shared outage)."""
        return self.consecutive - checks >= self.threshold


@dataclass
class HealthTracker:
    """Per replica (per pod UID): remembers progress and consecutive failures."""

    stall_seconds: float
    failure_threshold: int
    # Routed requests: a check fails when at least this share of the replica's
    # requests through the router failed over the last failure_threshold
    # checks, counting only when it answered at least routed_min_requests
    # then (a trickle says nothing). Over several checks, not one: once a
    # router's circuit breaker opens on the replica it gets no request, and
    # a rate of one period alone would fall silent before the threshold.
    error_rate_threshold: float = 0.5
    routed_min_requests: int = 20
    consecutive: int = 0
    _last_tokens: float | None = None
    _progress_at: float | None = None
    _history: list[Reason] = field(default_factory=list)
    _routed: deque[Routed] = field(default_factory=deque)

    def observe(self, probe: Probe, *, routed: Routed | None = None) -> Assessment:
        """routed: what the replica answered through the routers since the
        last check (None when unknown)."""
        reason, detail = self._classify(probe, self._routed_failing(routed))
        self.consecutive = 0 if reason is Reason.HEALTHY else self.consecutive + 1
        return Assessment(
            reason=reason,
            detail=detail,
            consecutive=self.consecutive,
            threshold=self.failure_threshold,
            connection_level=probe.health in (Outcome.REFUSED, Outcome.TIMEOUT),
        )

    def _stalled_for(self, probe: Probe) -> float:
        """Seconds that requests have been running with no new generated token."""
        tokens = probe.progress
        if tokens is None:
            return 0.0
        moved = self._last_tokens is None or tokens != self._last_tokens
        self._last_tokens = tokens
        if moved or probe.running <= 0 or self._progress_at is None:
            self._progress_at = probe.at
            return 0.0
        return probe.at - self._progress_at

    def _routed_failing(self, routed: Routed | None) -> str | None:
        """Why the replica's routed requests count as failing, if they do."""
        self._routed.append(routed or Routed())
        while len(self._routed) > max(self.failure_threshold, 1):
            self._routed.popleft()
        total = sum(self._routed, Routed())
        if total.requests < max(self.routed_min_requests, 1):
            return None
        if total.rate < self.error_rate_threshold:
            return None
        checks = len(self._routed)
        over = "the last check" if checks == 1 else f"the last {checks} checks"
        return (
            f"{total.rate:.0%} of routed requests failed ({total.errors:.0f} of "
            f"{total.requests:.0f} answered 5xx through the router over {over})"
        )

    def _classify(self, probe: Probe, routed_failing: str | None) -> tuple[Reason, str]:
        stalled = self._stalled_for(probe)
        if probe.health is not Outcome.OK:
            status = f" {probe.health_status}" if probe.health_status else ""
            return Reason.DEAD, f"/health {probe.health.value}{status}"
        flat = probe.progress_during_canary is not None and probe.progress_during_canary <= 0
        if probe.canary is Outcome.TIMEOUT and (flat or probe.running <= 0):
            # Busy engines answer canaries late but keep stepping: only a
            # canary that times out while nothing moves is a hang.
            return Reason.HUNG, (
                "canary timed out and no token was generated (nor engine step taken) meanwhile"
            )
        if stalled >= self.stall_seconds:
            return Reason.STALLED, (
                f"{probe.running:.0f} requests running, no token generated (nor engine step "
                f"taken) for {stalled:.0f}s"
            )
        if probe.canary in (Outcome.ERROR, Outcome.REFUSED):
            status = f" {probe.canary_status}" if probe.canary_status else ""
            detail = f"canary completion {probe.canary.value}{status}"
            return Reason.FAILING, f"{detail}; {routed_failing}" if routed_failing else detail
        if routed_failing is not None:
            return Reason.FAILING, routed_failing
        if not probe.metrics_ok:
            return Reason.METRICS, "/metrics unavailable: the router counts it as full load"
        return Reason.HEALTHY, "health, canary and progress checks passed"
