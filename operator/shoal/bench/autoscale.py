"""The autoscaling benchmark's pure parts (`make bench-autoscale`; the runner
is hack/autoscale_bench.py): a day-like load shape, its arrivals, and the
report of a run (P99 TTFT overall and during ramps, replica-seconds, the
latency of a request sent at zero replicas), per mode and over repeats.

A day is compressed to a few minutes: quiet, a ramp up, the peak, the fall,
idle. The request rate goes linearly between a phase's start and end rates;
arrivals are a seeded Poisson process with that rate (by thinning), so every
mode of a repeat sees the same requests at the same offsets."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from shoal.bench.stats import percentile


class PhaseName(StrEnum):
    QUIET = "quiet"
    RAMP = "ramp"
    PEAK = "peak"
    FALL = "fall"
    IDLE = "idle"


# Phases whose load changes: "P99 TTFT during ramps" is over requests sent in them.
RAMPS = frozenset({PhaseName.RAMP, PhaseName.FALL})


@dataclass(frozen=True, kw_only=True)
class Phase:
    name: PhaseName
    seconds: float
    start_rate: float  # requests per second at the phase's start
    end_rate: float  # ... and at its end (linear in between)


def day(*, quiet_rate: float, peak_rate: float, seconds: Mapping[PhaseName, float]) -> list[Phase]:
    """quiet, ramp up, peak, fall, idle (no request), each `seconds[name]` long."""
    rates = {
        PhaseName.QUIET: (quiet_rate, quiet_rate),
        PhaseName.RAMP: (quiet_rate, peak_rate),
        PhaseName.PEAK: (peak_rate, peak_rate),
        PhaseName.FALL: (peak_rate, quiet_rate),
        PhaseName.IDLE: (0.0, 0.0),
    }
    return [
        Phase(name=name, seconds=seconds[name], start_rate=start, end_rate=end)
        for name, (start, end) in rates.items()
    ]


def length(phases: Sequence[Phase]) -> float:
    return sum(p.seconds for p in phases)


def phase_at(phases: Sequence[Phase], at: float) -> Phase | None:
    """The phase holding offset `at` (seconds from the day's start); None past the end."""
    begin = 0.0
    for phase in phases:
        if begin <= at < begin + phase.seconds:
            return phase
        begin += phase.seconds
    return None


def rate_at(phases: Sequence[Phase], at: float) -> float:
    begin = 0.0
    for phase in phases:
        if begin <= at < begin + phase.seconds:
            share = (at - begin) / phase.seconds if phase.seconds else 0.0
            return phase.start_rate + (phase.end_rate - phase.start_rate) * share
        begin += phase.seconds
    return 0.0


def arrivals(phases: Sequence[Phase], *, seed: int) -> list[float]:
    """Offsets of the day's requests: a Poisson process of rate rate_at(t),
    drawn by thinning one of the day's highest rate."""
    top = max((max(p.start_rate, p.end_rate) for p in phases), default=0.0)
    if top <= 0:
        return []
    rng = random.Random(f"{seed}-day")
    end = length(phases)
    found = []
    at = rng.expovariate(top)
    while at < end:
        if rng.random() * top < rate_at(phases, at):
            found.append(at)
        at += rng.expovariate(top)
    return found


@dataclass(frozen=True, kw_only=True)
class Request:
    """One request of a run: when it was sent (seconds from the day's start),
    its TTFT (seconds; None: it failed)."""

    sent: float
    ttft: float | None


def following(
    demand: Sequence[tuple[float, float | None]], *, target: float, most: int
) -> list[tuple[float, int]]:
    """The replica counts of a fleet that followed the measured demand exactly
    and at once: ceil(demand / target), at most `most`, 0 at no demand; no
    window, start-up or drain. Its replica-seconds bound what any autoscaler
    on the same target could reach on the day. A sample without a signal
    (None) keeps the count before it."""
    counts: list[tuple[float, int]] = []
    count = 0
    for at, requests in demand:
        if requests is not None:
            count = min(most, math.ceil(requests / target - 1e-9)) if requests > 0 else 0
        counts.append((at, count))
    return counts


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    mode: str
    requests: int
    failed: int
    p99_ttft_ms: float
    p99_ramp_ttft_ms: float  # requests sent while the load rose or fell
    p50_ttft_ms: float
    replica_seconds: float
    # A request sent once the idle fleet is at zero replicas, after the day
    # (None: not measured, as for a static fleet).
    from_zero_ms: float | None


def replica_seconds(samples: Sequence[tuple[float, int]], *, end: float) -> float:
    """The integral of the replica count over [first sample, end]; samples
    (offset, replicas) in time order, each count holding until the next."""
    total = 0.0
    for (at, count), (following, _) in zip(samples, [*samples[1:], (end, 0)], strict=True):
        total += count * max(0.0, min(following, end) - at)
    return total


def summarize(
    mode: str,
    requests: Sequence[Request],
    replicas: Sequence[tuple[float, int]],
    *,
    phases: Sequence[Phase],
    from_zero: float | None = None,
) -> RunSummary:
    """from_zero: the TTFT (seconds) of the request sent at zero replicas."""
    ms = [r.ttft * 1000 for r in requests if r.ttft is not None]
    ramps = [
        r.ttft * 1000
        for r in requests
        if r.ttft is not None and (p := phase_at(phases, r.sent)) is not None and p.name in RAMPS
    ]
    return RunSummary(
        mode=mode,
        requests=len(requests),
        failed=sum(1 for r in requests if r.ttft is None),
        p99_ttft_ms=percentile(ms, 99),
        p99_ramp_ttft_ms=percentile(ramps, 99),
        p50_ttft_ms=percentile(ms, 50),
        replica_seconds=replica_seconds(replicas, end=length(phases)),
        from_zero_ms=None if from_zero is None else from_zero * 1000,
    )


@dataclass(frozen=True, kw_only=True)
class Spread:
    """A measure over repeats: the median and the range."""

    median: float
    low: float
    high: float
    runs: int

    def text(self, digits: int = 0) -> str:
        if math.isnan(self.median):
            return "n/a"
        if self.runs == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"


def spread(values: Sequence[float | None]) -> Spread:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return Spread(median=math.nan, low=math.nan, high=math.nan, runs=0)
    return Spread(median=statistics.median(kept), low=min(kept), high=max(kept), runs=len(kept))


MEASURES = (
    ("p99_ttft_ms", "P99 TTFT ms"),
    ("p99_ramp_ttft_ms", "P99 TTFT ms, ramps"),
    ("p50_ttft_ms", "P50 TTFT ms"),
    ("replica_seconds", "replica-s"),
    ("from_zero_ms", "first request from zero, ms"),
    ("failed", "failed"),
)


def by_mode(runs: Sequence[RunSummary]) -> dict[str, dict[str, Spread]]:
    """Each mode's measures over its repeats (modes in first-seen order)."""
    modes: dict[str, list[RunSummary]] = {}
    for run in runs:
        modes.setdefault(run.mode, []).append(run)
    return {
        mode: {key: spread([getattr(r, key) for r in found]) for key, _ in MEASURES}
        for mode, found in modes.items()
    }


@dataclass(frozen=True, kw_only=True)
class Target:
    what: str
    value: float
    limit: str
    met: bool


def targets(
    table: Mapping[str, Mapping[str, Spread]], *, static: str, warm: str, cold: str
) -> list[Target]:
    """The issue's targets on the medians: replica-seconds <= 0.6x the static
    fleet's, P99 TTFT during ramps <= 1.5x static's, and warm-gated scale-up
    with a lower P99 TTFT than ungated."""
    fixed, gated, ungated = table[static], table[warm], table[cold]
    cost = gated["replica_seconds"].median / fixed["replica_seconds"].median
    ramp = gated["p99_ramp_ttft_ms"].median / fixed["p99_ramp_ttft_ms"].median
    warm_p99, cold_p99 = gated["p99_ttft_ms"].median, ungated["p99_ttft_ms"].median
    return [
        Target(what="replica-s, autoscaled / static", value=cost, limit="<= 0.6", met=cost <= 0.6),
        Target(
            what="P99 TTFT during ramps, autoscaled / static",
            value=ramp,
            limit="<= 1.5",
            met=ramp <= 1.5,
        ),
        Target(
            what="P99 TTFT, warm-gated / ungated",
            value=warm_p99 / cold_p99,
            limit="< 1",
            met=warm_p99 < cold_p99,
        ),
    ]


def table_text(table: Mapping[str, Mapping[str, Spread]]) -> str:
    """The modes' medians [range over runs] as a Markdown table."""
    head = "| mode | runs | " + " | ".join(name for _, name in MEASURES) + " |"
    rule = "|---" * (len(MEASURES) + 2) + "|"
    rows = [
        f"| {mode} | {max(s.runs for s in found.values())} | "
        + " | ".join(found[key].text() for key, _ in MEASURES)
        + " |"
        for mode, found in table.items()
    ]
    return "\n".join([head, rule, *rows])


@dataclass(frozen=True, kw_only=True)
class Bin:
    start: float
    offered: float  # requests sent per second in the bin
    replicas: float  # the mean count over the bin
    p99_ttft_ms: float  # of requests sent in it; NaN without any


def timeline(
    requests: Sequence[Request],
    replicas: Sequence[tuple[float, int]],
    *,
    end: float,
    bin_seconds: float,
) -> list[Bin]:
    """The run as bins of bin_seconds: load, replicas and P99 TTFT over time."""
    bins = []
    count = math.ceil(end / bin_seconds)
    for i in range(count):
        low, high = i * bin_seconds, min((i + 1) * bin_seconds, end)
        sent = [r for r in requests if low <= r.sent < high]
        ttfts = [r.ttft * 1000 for r in sent if r.ttft is not None]
        inside = [(max(at, low), n) for at, n in replicas if at < high]
        # The count in force at the bin's start is the last sample before it.
        before = [s for s in inside if s[0] <= low]
        series = ([before[-1]] if before else []) + [s for s in inside if s[0] > low]
        mean = replica_seconds(series, end=high) / (high - low) if series else 0.0
        bins.append(
            Bin(
                start=low,
                offered=len(sent) / (high - low),
                replicas=mean,
                p99_ttft_ms=percentile(ttfts, 99),
            )
        )
    return bins
