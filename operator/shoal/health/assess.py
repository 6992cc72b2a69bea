"""Pure assessment of probe results: which failures count, and when a replica
has failed often enough in a row to be restarted."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


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
    generation_tokens: float | None = None
    # Tokens generated between the canary's start and its deadline (None if unknown).
    tokens_during_canary: float | None = None


@dataclass(frozen=True)
class Assessment:
    reason: Reason
    detail: str
    consecutive: int
    unhealthy: bool  # failed failure_threshold times in a row: restart it
    connection_level: bool  # the operator may be the one cut off

    @property
    def ok(self) -> bool:
        return self.reason is Reason.HEALTHY


@dataclass
class HealthTracker:
    """Per replica (per pod UID): remembers progress and consecutive failures."""

    stall_seconds: float
    failure_threshold: int
    error_rate_threshold: float = 0.5
    consecutive: int = 0
    _last_tokens: float | None = None
    _progress_at: float | None = None
    _history: list[Reason] = field(default_factory=list)

    def observe(self, probe: Probe, *, router_error_rate: float | None = None) -> Assessment:
        reason, detail = self._classify(probe, router_error_rate)
        self.consecutive = 0 if reason is Reason.HEALTHY else self.consecutive + 1
        return Assessment(
            reason=reason,
            detail=detail,
            consecutive=self.consecutive,
            unhealthy=self.consecutive >= self.failure_threshold,
            connection_level=probe.health is Outcome.REFUSED,
        )

    def _stalled_for(self, probe: Probe) -> float:
        """Seconds that requests have been running with no new generated token."""
        tokens = probe.generation_tokens
        if tokens is None:
            return 0.0
        moved = self._last_tokens is None or tokens != self._last_tokens
        self._last_tokens = tokens
        if moved or probe.running <= 0 or self._progress_at is None:
            self._progress_at = probe.at
            return 0.0
        return probe.at - self._progress_at

    def _classify(self, probe: Probe, router_error_rate: float | None) -> tuple[Reason, str]:
        stalled = self._stalled_for(probe)
        if probe.health is not Outcome.OK:
            status = f" {probe.health_status}" if probe.health_status else ""
            return Reason.DEAD, f"/health {probe.health.value}{status}"
        flat = probe.tokens_during_canary is not None and probe.tokens_during_canary <= 0
        if probe.canary is Outcome.TIMEOUT and (flat or probe.running <= 0):
            # Busy engines answer canaries late but keep generating: only a
            # canary that times out while nothing moves is a hang.
            return Reason.HUNG, "canary timed out and no token was generated meanwhile"
        if stalled >= self.stall_seconds:
            return Reason.STALLED, (
                f"{probe.running:.0f} requests running, no token generated for {stalled:.0f}s"
            )
        if probe.canary in (Outcome.ERROR, Outcome.REFUSED):
            status = f" {probe.canary_status}" if probe.canary_status else ""
            return Reason.FAILING, f"canary completion {probe.canary.value}{status}"
        if router_error_rate is not None and router_error_rate >= self.error_rate_threshold:
            return Reason.FAILING, f"{router_error_rate:.0%} of routed requests failed"
        if not probe.metrics_ok:
            return Reason.METRICS, "/metrics unavailable: the router counts it as full load"
        return Reason.HEALTHY, "health, canary and progress checks passed"
