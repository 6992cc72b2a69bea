"""A circuit breaker per replica, as a small pure state machine (time is
passed in).

    CLOSED --failureThreshold consecutive failures--> OPEN
    OPEN --openSeconds pass--> HALF_OPEN (one probe may start)
    HALF_OPEN --the probe answers--> CLOSED
    HALF_OPEN --the probe fails--> OPEN
    CLOSED --the probe that closed it fails after all (a stream that stalls
             after its first bytes)--> OPEN
    HALF_OPEN --the probe ends without a verdict, or outlives probeSeconds--> HALF_OPEN
                (the slot is free: the next request probes)
    OPEN --recheck (the router's engine key changed)--> HALF_OPEN

Every attempt gets a ticket from `start()` and ends with `finish()`. Only the
outcomes of attempts started in the breaker's current epoch move it: each
transition starts a new epoch, so a stream that began before the breaker
opened cannot close it, and failures from before it closed cannot reopen it.
A probe that is cancelled, times out or whose client leaves ends with
`Outcome.NONE` and frees the slot; one whose end never comes is forgotten
after `probe_seconds`. So a replica whose engine answers is never left
unroutable."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum


class CircuitState(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Outcome(Enum):
    """What an attempt says about its replica."""

    OK = "ok"  # the engine answered
    FAILED = "failed"  # connection error, timeout, stall, or the engine's own 5xx
    NONE = "none"  # nothing: the client left, or the failure was the request's


@dataclass(slots=True)
class CircuitBreaker:
    failure_threshold: int
    open_seconds: float
    # Longest a probe may take to give its verdict (connect plus first byte);
    # past it the probe no longer holds the slot.
    probe_seconds: float = 300.0
    failures: int = 0
    opened_at: float | None = None
    epoch: int = 0
    probe: int | None = None  # the ticket of the probe in flight
    probe_started: float = 0.0
    # The ticket of the probe that closed it: its answer had begun, and its
    # own later failure (a stalled stream) reopens the breaker.
    trial: int | None = None

    def state(self, now: float) -> CircuitState:
        if self.opened_at is None:
            return CircuitState.CLOSED
        if now - self.opened_at >= self.open_seconds:
            return CircuitState.HALF_OPEN
        return CircuitState.OPEN

    def allows(self, now: float) -> bool:
        """May a request go to this replica now? In half-open, one at a time."""
        opened_at = self.opened_at
        if opened_at is None:
            return True
        if now - opened_at < self.open_seconds:
            return False
        return self.probe is None or now - self.probe_started >= self.probe_seconds

    def start(self, now: float) -> int:
        """An attempt starts; its ticket goes back with its outcome. In
        half-open it becomes the probe (a new epoch of its own)."""
        if self.opened_at is not None and self.allows(now):
            self.epoch += 1
            self.probe = self.epoch
            self.probe_started = now
        return self.epoch

    def finish(self, ticket: int, outcome: Outcome, now: float) -> bool:
        """An attempt's outcome; True when the breaker changed state."""
        if ticket == self.probe:
            self.probe = None
            if outcome is Outcome.OK:
                self._close()
                self.trial = ticket
                return True
            if outcome is Outcome.FAILED:
                self._open(now)
                return True
            return False  # no verdict: the next request probes
        if ticket == self.trial and self.opened_at is None and outcome is Outcome.FAILED:
            self._open(now)
            return True
        if ticket != self.epoch or self.opened_at is not None:
            return False  # started in an earlier state, or not closed
        if outcome is Outcome.OK:
            self.failures = 0
        elif outcome is Outcome.FAILED:
            self.failures += 1
            if self.failures >= self.failure_threshold:
                self._open(now)
                return True
        return False

    def passed(self, ticket: int) -> bool:
        """An attempt ended: True when it was the probe that closed the
        breaker and it did not fail after all (its trial is over)."""
        if ticket != self.trial:
            return False
        self.trial = None
        return True

    def recheck(self, now: float) -> None:
        """What it learned no longer holds (the router's engine key changed):
        an open breaker is half-open at once (the next request probes), a
        closed one forgets its failures, and attempts under way give no
        verdict (a new epoch)."""
        self.epoch += 1
        self.failures = 0
        self.probe = None
        self.trial = None
        if self.opened_at is not None:
            self.opened_at = min(self.opened_at, now - self.open_seconds)

    def _open(self, now: float) -> None:
        self.epoch += 1
        self.opened_at = now
        self.probe = None
        self.trial = None

    def _close(self) -> None:
        self.epoch += 1
        self.failures = 0
        self.opened_at = None
