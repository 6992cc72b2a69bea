"""A circuit breaker per replica: consecutive failures open it; after a
while one probe request is let through (half-open); its outcome closes or
re-opens it. Time is passed in, so the logic is pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class CircuitState(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass
class CircuitBreaker:
    failure_threshold: int
    open_seconds: float
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False

    def state(self, now: float) -> CircuitState:
        if self.opened_at is None:
            return CircuitState.CLOSED
        if now - self.opened_at >= self.open_seconds:
            return CircuitState.HALF_OPEN
        return CircuitState.OPEN

    def allows(self, now: float) -> bool:
        """May a request go to this replica now? In half-open, only one at a time."""
        state = self.state(now)
        if state is CircuitState.CLOSED:
            return True
        return state is CircuitState.HALF_OPEN and not self.probing

    def on_start(self, now: float) -> None:
        if self.state(now) is CircuitState.HALF_OPEN:
            self.probing = True

    def on_success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def on_failure(self, now: float) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.failure_threshold:
            self.opened_at = now
        self.probing = False
