"""How many replicas the load asks for. Pure: the policy, what the routers
reported, the fleet's counts and a little memory in; the replica count, why,
and the new memory out. `autoscaler` reads the routers and applies it.

- The recommendation is ceil(demand / target), demand being requests in
  flight plus queued at the routers. It is compared with spec.replicas,
  which counts replicas still starting or warming: capacity on the way is
  capacity, so a queue that builds while they warm does not add more than
  the demand asks for.
- Demand within `tolerance` of the target per current replica changes
  nothing (no flapping near a threshold).
- Stabilization as an HPA's: a scale-up takes the lowest recommendation of
  the up window, a scale-down the highest of the down window.
- Any demand keeps at least one replica; only `idle_seconds` without any
  request (demand 0 and no request counted) takes the fleet to minReplicas,
  past the down window.
- The result is within [minReplicas, maxReplicas]; a count set outside them
  (kubectl scale) is brought back at once.
- No router answered: nothing is known, nothing changes. A Ready router
  that did not answer makes the demand a lower bound: it can scale up, not
  down (nor to idle)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from shoal.router.metrics import INFLIGHT, QUEUE_DEPTH, REQUESTS, read_samples


class ScaleReason(StrEnum):
    """Why the last decision set (or kept) the replica count."""

    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    IDLE = "Idle"  # no request for idleSeconds: to minReplicas
    OUT_OF_BOUNDS = "OutOfBounds"  # replicas set outside [min, max]
    WITHIN_TOLERANCE = "WithinTolerance"
    STABILIZING = "Stabilizing"  # the window holds a change back
    NO_SIGNAL = "NoSignal"  # no router answered
    PARTIAL_SIGNAL = "PartialSignal"  # a ready router did not answer: no scale-down
    STEADY = "Steady"  # the recommendation is the current count
    STOOD_ASIDE = "StoodAside"  # an HPA or ScaledObject scales the cluster


@dataclass(frozen=True, kw_only=True)
class ScalePolicy:
    min_replicas: int
    max_replicas: int
    target: float  # demand per replica
    tolerance: float
    up_window_seconds: float
    down_window_seconds: float
    idle_seconds: float


@dataclass(frozen=True, kw_only=True)
class Demand:
    """What the routers reported this round: None when no router answered."""

    requests: float | None  # in flight plus queued, summed over the routers
    arrived: bool  # any request counted since the last round
    # Ready routers that did not answer: requests is then a lower bound.
    silent: int = 0


@dataclass(frozen=True)
class ScaleMemory:
    """Recommendations of the last windows (monotonic seconds, count), and
    when a request was last seen (None: not since the operator started)."""

    recommendations: tuple[tuple[float, int], ...] = ()
    last_active: float | None = None
    started: float | None = None  # the first round, so idle counts from there


@dataclass(frozen=True, kw_only=True)
class ScaleDecision:
    desired: int
    reason: ScaleReason
    message: str
    recommended: int | None  # the unstabilized recommendation (None: no signal)
    memory: ScaleMemory = field(default_factory=ScaleMemory)

    @property
    def changed(self) -> bool:
        return self.reason in (
            ScaleReason.SCALED_UP,
            ScaleReason.SCALED_DOWN,
            ScaleReason.IDLE,
            ScaleReason.OUT_OF_BOUNDS,
        )


@dataclass(frozen=True)
class RouterDemand:
    """One router pod's /metrics, as far as demand goes."""

    in_flight: float
    queued: float
    answered: float  # requests it answered so far, every replica and code
    # Requests in flight by replica (the router's label: the leader pod's name).
    by_replica: Mapping[str, float] = field(default_factory=dict)


def parse_router_demand(text: str) -> RouterDemand:
    """A router's demand from its Prometheus text; ValueError when it is not that."""
    wanted = (INFLIGHT, QUEUE_DEPTH, REQUESTS)
    kept = "\n".join(line for line in text.splitlines() if any(n in line[:80] for n in wanted))
    in_flight = queued = answered = 0.0
    by_replica: dict[str, float] = {}
    for sample in read_samples(kept + "\n"):
        if sample.name == INFLIGHT:
            in_flight += sample.value
            replica = sample.labels.get("replica", "")
            by_replica[replica] = by_replica.get(replica, 0.0) + sample.value
        elif sample.name == QUEUE_DEPTH:
            queued += sample.value
        elif sample.name == REQUESTS + "_total":
            answered += sample.value
    if not math.isfinite(in_flight + queued):
        raise ValueError("requests in flight and queued sum past the largest float")
    return RouterDemand(
        in_flight=in_flight, queued=queued, answered=answered, by_replica=by_replica
    )


def in_flight_by_replica(scrapes: Mapping[str, RouterDemand | None]) -> dict[str, float]:
    """Requests in flight to each replica (by the routers' label), over every router."""
    total: dict[str, float] = {}
    for found in scrapes.values():
        for replica, count in (found.by_replica if found is not None else {}).items():
            total[replica] = total.get(replica, 0.0) + count
    return total


def total_demand(
    scrapes: Mapping[str, RouterDemand | None],
    before: Mapping[str, float],
    *,
    ready: Collection[str] = (),
) -> tuple[Demand, dict[str, float]]:
    """This round's demand over the router pods (by uid; None: its scrape
    failed; ready: the uids of those Ready), and each pod's answered count
    for the next round. A request counts as arrived when a pod's count moved
    (or went down: it restarted)."""
    answered = {uid: found.answered for uid, found in scrapes.items() if found is not None}
    # A pod that missed this scrape keeps its count, so what it answers
    # meanwhile is seen at its next; a pod gone from the list is forgotten.
    counted = {uid: before[uid] for uid in scrapes if uid in before} | answered
    if not answered:
        return Demand(requests=None, arrived=False), counted
    found = [d for d in scrapes.values() if d is not None]
    arrived = any(uid in before and count != before[uid] for uid, count in answered.items())
    requests = sum(d.in_flight + d.queued for d in found)
    if not math.isfinite(requests):  # each router's finite, their sum not: no reading
        return Demand(requests=None, arrived=False), counted
    silent = sum(1 for uid, d in scrapes.items() if d is None and uid in ready)
    return Demand(requests=requests, arrived=arrived, silent=silent), counted


def recommend(policy: ScalePolicy, *, demand: float, current: int) -> int:
    """Replicas for this demand, before windows and bounds; current when the
    demand per current replica is within tolerance of the target."""
    if current > 0 and demand > 0:
        ratio = demand / (current * policy.target)
        if abs(ratio - 1.0) <= policy.tolerance:
            return current
    wanted = math.ceil(demand / policy.target - 1e-9)
    return max(wanted, 1) if demand > 0 else 0


def decide_scale(
    policy: ScalePolicy, *, demand: Demand, current: int, memory: ScaleMemory, now: float
) -> ScaleDecision:
    """The replica count to set; current is spec.replicas (replicas starting
    or warming included)."""
    started = memory.started if memory.started is not None else now
    last_active = memory.last_active
    if demand.requests is not None and (demand.requests > 0 or demand.arrived):
        last_active = now
    horizon = max(policy.up_window_seconds, policy.down_window_seconds)
    kept = tuple((t, n) for t, n in memory.recommendations if now - t <= horizon)
    if memory.started is None:
        # A first round (a new cluster, a restarted operator): the count as it
        # is stands for the window before, as an HPA seeds its own, so a
        # scale-down still waits a whole down window.
        kept = ((now - 1e-6, current),)
    bounded = _clamp(policy, current)
    if demand.requests is None:
        return _outcome(
            policy,
            current=current,
            desired=bounded,
            raw=None,
            # Left as they are is what it asks for: once routers answer
            # again, a scale-down still waits a whole down window.
            memory=ScaleMemory((*kept, (now, current)), last_active, started),
            held=(ScaleReason.NO_SIGNAL, "no router answered /metrics: replicas left as they are"),
        )
    summary = f"demand {demand.requests:g} for {current} replicas (target {policy.target:g} each)"
    idle_since = last_active if last_active is not None else started
    idle = demand.requests == 0 and now - idle_since >= policy.idle_seconds
    if idle and not demand.silent:
        desired = policy.min_replicas
        idle_memory = ScaleMemory((), last_active, started)
        if desired == current:
            return _outcome(
                policy,
                current=current,
                desired=current,
                raw=0,
                memory=idle_memory,
                held=(ScaleReason.STEADY, f"idle: at minReplicas ({desired})"),
            )
        return ScaleDecision(
            desired=desired,
            reason=ScaleReason.IDLE,
            message=f"no request for {policy.idle_seconds:g}s: {current} -> {desired} replicas",
            recommended=0,
            memory=idle_memory,
        )
    raw = recommend(policy, demand=demand.requests, current=current)
    if current > 0 or demand.requests > 0 or demand.arrived:
        # Until idle, demand that just ended still keeps one replica; a fleet
        # at zero that nobody asked of has none to keep (a restarted operator
        # knows no last request, a silent router's demand is unknown).
        raw = max(raw, 1)
    # A silent router's demand is unknown, not 0: what answered can tell a
    # scale-up, never a scale-down (an HPA counts pods missing metrics as at
    # target when it would scale down). Recorded as the current count, so the
    # down window starts again once every router answers.
    partial = demand.silent > 0 and raw < current
    if partial:
        raw = current
    history = (*kept, (now, raw))
    next_memory = ScaleMemory(history, last_active, started)
    # An HPA's stabilization: up to the lowest recommendation of the up window,
    # down to the highest of the down window.
    up = min(n for t, n in history if now - t <= policy.up_window_seconds)
    down = max(n for t, n in history if now - t <= policy.down_window_seconds)
    desired = current
    if desired < up:
        desired = up
    if desired > down:
        desired = down
    desired = _clamp(policy, desired)
    if partial:
        routers = "1 ready router" if demand.silent == 1 else f"{demand.silent} ready routers"
        held = (
            ScaleReason.PARTIAL_SIGNAL,
            f"{summary}: {routers} did not answer /metrics, so no scale-down",
        )
    elif raw == current and math.ceil(demand.requests / policy.target - 1e-9) != current:
        held = (ScaleReason.WITHIN_TOLERANCE, f"{summary}: within {policy.tolerance:.0%} of target")
    elif raw != current:
        held = (ScaleReason.STABILIZING, f"{summary} asks for {raw}: the window holds it back")
    else:
        held = (ScaleReason.STEADY, summary)
    return _outcome(
        policy,
        current=current,
        desired=desired,
        raw=raw,
        memory=next_memory,
        held=held,
        summary=summary,
    )


def _clamp(policy: ScalePolicy, count: int) -> int:
    return min(max(count, policy.min_replicas), policy.max_replicas)


def _outcome(
    policy: ScalePolicy,
    *,
    current: int,
    desired: int,
    raw: int | None,
    memory: ScaleMemory,
    held: tuple[ScaleReason, str],
    summary: str = "",
) -> ScaleDecision:
    """The decision for a desired count: out of bounds, up, down, or held (why)."""
    if current != _clamp(policy, current) and desired == _clamp(policy, current):
        return ScaleDecision(
            desired=desired,
            reason=ScaleReason.OUT_OF_BOUNDS,
            message=f"{current} replicas is outside [{policy.min_replicas}, "
            f"{policy.max_replicas}]: set to {desired}",
            recommended=raw,
            memory=memory,
        )
    if desired == current:
        reason, message = held
        return ScaleDecision(
            desired=current, reason=reason, message=message, recommended=raw, memory=memory
        )
    up = desired > current
    return ScaleDecision(
        desired=desired,
        reason=ScaleReason.SCALED_UP if up else ScaleReason.SCALED_DOWN,
        message=f"{summary}: scaled {'up' if up else 'down'} {current} -> {desired}",
        recommended=raw,
        memory=memory,
    )
