"""The fault matrix's plan and verdicts, pure: which faults, what each should
cost clients, the bounds the router's settings give for taking a faulted
replica out and bringing it back, and the verdicts drawn from what a run saw
(the clients' outcomes and the router's metrics, sampled).

Definitions (every time in seconds from the fault, or from its clearing):

- lost: client requests that failed though a retry was possible. A stream
  cut after generated text reached the client cannot be retried (the router
  retries only before the first byte of the answer), so faults that stop an
  engine in the middle of streams (SIGKILL, SIGSTOP, a hang, a mid-stream
  stall) cut the streams that had begun on it: those are counted apart, as
  `cut`, never as lost. A
  request whose own content makes every engine fail (the request-specific
  500) is the client's: it gets the engine's answer, and is not lost.
- time out: from the fault until the router stopped sending requests to the
  replica: its breaker opened, or the last attempt there failed (after which
  its score kept it out), whichever came first.
- time back: from the fault's clearing (an engine restarted and healthy
  again, a process continued, a fault lifted) until the first request sent
  afterwards that the replica served.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum

from shoal.api.router import RouterSettings
from shoal.router.breaker import CircuitState
from shoal.router.fleet import ERROR_HALF_LIFE

# Slack on every bound for a loaded machine (2 cores shared by many runs):
# the bounds check that a replica comes back at all, promptly, not speed.
MARGIN_SECONDS = 1.5
# A tie tolerance of 0 would leave a scored-down replica out until others are
# busier: the bound counts it as this.
MIN_TOLERANCE = 0.01


class Fault(StrEnum):
    """One fault of the matrix; its value is the test case's id."""

    SIGKILL = "sigkill"
    SIGSTOP = "sigstop"
    HANG = "hang-health-200"
    REFUSED = "refused-connections"
    RESET = "reset-connections"
    ERRORS = "errors-50pct"
    METRICS_HANG = "metrics-hang"
    METRICS_500 = "metrics-500"
    METRICS_GARBAGE = "metrics-garbage"
    CLIENT_DISCONNECTS = "client-disconnects"
    SLOW_CLIENTS = "slow-clients"
    REQUEST_500 = "request-specific-500"
    STALL = "mid-stream-stall"


class Failing(Enum):
    """How long one attempt at the faulted replica takes to fail."""

    NOT = "not"  # attempts do not fail (or fail as the request's own)
    AT_CONNECT = "connect"  # refused, reset: within connectSeconds
    FAST = "fast"  # an answer, a 500: at once
    NO_FIRST_BYTE = "first-byte"  # the engine takes the request, never answers
    MID_STREAM = "stall"  # answers, then stops: first byte, then the stall deadline


@dataclass(frozen=True)
class FaultSpec:
    fault: Fault
    failing: Failing
    takes_out: bool  # the router should stop sending to the replica
    cuts_streams: bool  # open streams on it break after their first byte
    on_every_engine: bool = False  # the request's fault: every engine fails it
    note: str = ""


SPECS: dict[Fault, FaultSpec] = {
    s.fault: s
    for s in (
        FaultSpec(Fault.SIGKILL, Failing.AT_CONNECT, True, True, note="open streams die with it"),
        FaultSpec(Fault.SIGSTOP, Failing.NO_FIRST_BYTE, True, True, note="open streams stall"),
        FaultSpec(Fault.HANG, Failing.NO_FIRST_BYTE, True, True, note="open streams stall"),
        FaultSpec(Fault.REFUSED, Failing.AT_CONNECT, True, False),
        FaultSpec(Fault.RESET, Failing.AT_CONNECT, True, False),
        FaultSpec(Fault.ERRORS, Failing.FAST, False, False, note="stays in, scored down"),
        FaultSpec(Fault.METRICS_HANG, Failing.NOT, False, False, note="load unknown: busy"),
        FaultSpec(Fault.METRICS_500, Failing.NOT, False, False, note="load unknown: busy"),
        FaultSpec(Fault.METRICS_GARBAGE, Failing.NOT, False, False, note="load unknown: busy"),
        FaultSpec(Fault.CLIENT_DISCONNECTS, Failing.NOT, False, False, note="clients' fault"),
        FaultSpec(Fault.SLOW_CLIENTS, Failing.NOT, False, False, note="clients' fault"),
        FaultSpec(
            Fault.REQUEST_500,
            Failing.NOT,
            False,
            False,
            on_every_engine=True,
            note="the request's 500 goes back to it",
        ),
        FaultSpec(
            Fault.STALL, Failing.MID_STREAM, True, True, note="streams cut at the stall deadline"
        ),
    )
}


def attempt_seconds(spec: FaultSpec, settings: RouterSettings) -> float:
    """The longest one attempt at the faulted replica takes to fail."""
    timeouts = settings.timeouts
    return {
        Failing.NOT: 0.0,
        Failing.AT_CONNECT: float(timeouts.connect_seconds),
        Failing.FAST: 0.0,
        Failing.NO_FIRST_BYTE: float(timeouts.first_byte_seconds),
        Failing.MID_STREAM: float(timeouts.first_byte_seconds + timeouts.stall_seconds),
    }[spec.failing]


def _scrape_round(settings: RouterSettings) -> float:
    """The longest one scrape round takes (a hanging scrape holds it)."""
    return settings.scrape_interval_seconds + settings.scrape_timeout_seconds


def out_bound(spec: FaultSpec, settings: RouterSettings) -> float | None:
    """How soon the router must have stopped sending to the replica; None when
    it should keep it. The first attempts after the fault fail one attempt's
    deadline later; until then nothing tells the router (a hung engine's
    gauges freeze), so attempts may still start, and the last of those that
    open the breaker (or after which its error rate keeps it out) fails one
    more deadline later; the scraper's view lags up to two rounds."""
    if not spec.takes_out:
        return None
    return 2 * attempt_seconds(spec, settings) + 2 * _scrape_round(settings) + MARGIN_SECONDS


def back_bound(
    spec: FaultSpec, settings: RouterSettings, *, request_seconds: float, breaker_opened: bool
) -> float:
    """How soon after the fault clears the replica must serve again: an
    attempt caught in flight by the clearing fails (one attempt's deadline),
    an open breaker turns half-open openSeconds after it, the scraper sees
    the engine (two rounds), and the probe is one request (`request_seconds`,
    a healthy request's time) that must be sent there. A half-open replica is
    judged by its load alone, so the probe goes there like to any idle peer.

    A replica whose attempts failed without opening its breaker carries an
    error rate in its cost instead (times loadTokens), fading with a half-life
    (`shoal.router.fleet.ERROR_HALF_LIFE`). Under a light load nothing else
    sets the replicas apart, so it draws requests again once the rate is
    within the policy's tie tolerance, from at most 1: log2(1 / tieTolerance)
    half-lives."""
    fading = 0.0
    if not breaker_opened and spec.failing is not Failing.NOT:
        tolerance = max(settings.thresholds.tie_tolerance, MIN_TOLERANCE)
        fading = ERROR_HALF_LIFE * math.log2(1 / tolerance)
    return (
        fading
        + attempt_seconds(spec, settings)
        + settings.circuit_breaker.open_seconds
        + 2 * _scrape_round(settings)
        + 2 * request_seconds
        + MARGIN_SECONDS
    )


@dataclass(frozen=True)
class RequestOutcome:
    """One client request of the load, as the client saw it (seconds from the
    start of the load)."""

    index: int
    sent: float
    ended: float
    ok: bool
    replica: str | None = None  # who answered (the router's replica header)
    error: str | None = None  # for a failed request: its HTTP status, or how it broke
    poisoned: bool = False  # carried the request-specific fault's text
    chunks: int = 0  # streamed events with generated text that reached the client

    @property
    def began(self) -> bool:
        """Its answer had begun: generated text had reached the client, so
        the router could not retry it any more. (Headers alone are no
        answer: an engine sends them before its first token, and a hung one
        sends nothing after them.)"""
        return self.replica is not None and self.chunks > 0


@dataclass(frozen=True)
class RouterSample:
    """The router's view of the faulted replica at one moment."""

    at: float
    circuit: CircuitState
    failed_attempts: float  # its attempts answered 5xx, 502 (connect) or 504 (no answer)


@dataclass(frozen=True)
class Verdict:
    fault: Fault
    requests: int
    lost: list[RequestOutcome]
    cut: list[RequestOutcome]
    own_errors: int  # the request-specific 500s, answered as the engine did
    out_seconds: float | None  # None: never out
    back_seconds: float | None  # None: not back within the run
    faulted_share: float  # share of the requests sent during the fault it served
    breaker_opened: bool


def classify(
    outcomes: Sequence[RequestOutcome], *, spec: FaultSpec, faulted: str
) -> tuple[list[RequestOutcome], list[RequestOutcome], int]:
    """(lost, cut after their first byte, the requests' own errors)."""
    lost: list[RequestOutcome] = []
    cut: list[RequestOutcome] = []
    own = 0
    for outcome in outcomes:
        if outcome.ok:
            continue
        if outcome.poisoned and (outcome.error or "").startswith("HTTP 500"):
            own += 1
        elif spec.cuts_streams and outcome.replica == faulted and outcome.began:
            cut.append(outcome)
        else:
            lost.append(outcome)
    return lost, cut, own


def time_out(samples: Sequence[RouterSample], *, fault_at: float, clear_at: float) -> float | None:
    """From the fault to its breaker opening or its last failed attempt,
    whichever came first; 0 when no attempt there failed (the router
    routed around it from the start); None when the breaker never opened
    and attempts kept failing until the fault cleared."""
    before = [s for s in samples if s.at < fault_at]
    window = [s for s in samples if fault_at <= s.at <= clear_at]
    if not window:
        return None
    failed = before[-1].failed_attempts if before else window[0].failed_attempts
    opened: float | None = None
    last_failure: float | None = None
    for sample in window:
        if opened is None and sample.circuit is CircuitState.OPEN:
            opened = sample.at
        if sample.failed_attempts > failed:
            failed = sample.failed_attempts
            last_failure = sample.at
    if opened is not None:
        return opened - fault_at
    if last_failure is None:
        return 0.0
    return last_failure - fault_at


def time_back(outcomes: Sequence[RequestOutcome], *, faulted: str, clear_at: float) -> float | None:
    """From the clearing to the first request sent afterwards that the
    replica served."""
    served = [o.sent for o in outcomes if o.ok and o.replica == faulted and o.sent >= clear_at]
    return min(served) - clear_at if served else None


def verdict(
    *,
    spec: FaultSpec,
    outcomes: Sequence[RequestOutcome],
    samples: Sequence[RouterSample],
    faulted: str,
    fault_at: float,
    clear_at: float,
) -> Verdict:
    lost, cut, own = classify(outcomes, spec=spec, faulted=faulted)
    during = [o for o in outcomes if fault_at <= o.sent < clear_at and o.ok]
    share = sum(o.replica == faulted for o in during) / len(during) if during else 0.0
    return Verdict(
        fault=spec.fault,
        requests=len(outcomes),
        lost=lost,
        cut=cut,
        own_errors=own,
        out_seconds=time_out(samples, fault_at=fault_at, clear_at=clear_at),
        back_seconds=time_back(outcomes, faulted=faulted, clear_at=clear_at),
        faulted_share=share,
        breaker_opened=any(
            s.circuit is CircuitState.OPEN and fault_at <= s.at <= clear_at for s in samples
        ),
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: Sequence[tuple[Verdict, float | None, float]]) -> str:
    """A Markdown table of verdicts with their bounds (out bound, back bound)."""
    lines = [
        "| fault | requests | lost | cut mid-stream | own 500s | out s (bound) | "
        "back s (bound) | faulted share | breaker opened | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, out_limit, back_limit in rows:
        spec = SPECS[v.fault]
        out = "kept" if out_limit is None else f"{_seconds(v.out_seconds)} ({out_limit:.1f})"
        lines.append(
            f"| {v.fault.value} | {v.requests} | {len(v.lost)} | {len(v.cut)} | {v.own_errors} "
            f"| {out} | {_seconds(v.back_seconds)} ({back_limit:.1f}) | {v.faulted_share:.0%} "
            f"| {'yes' if v.breaker_opened else 'no'} | {spec.note} |"
        )
    return "\n".join(lines)
