"""What to do next for one cluster: the desired fleet against the observed
one. Pure: facts, probe results, a little memory and the time in; actions,
events and the new memory out. The reconciler (`reconcile`) carries them out.

- Missing replicas are created at once; replicas beyond spec.replicas are
  drained (out of routing first, deleted once in-flight requests finished or a
  deadline passed), highest indices being the ones removed.
- Replicas whose manifests or pods are outdated are replaced whole (every pod
  of the group), at most rollout.maxUnavailable at a time, counting replicas
  that are already not Ready, the next only once the last is Ready again.
- A multi-node group whose member was replaced or restarted restarts whole:
  vLLM ranks cannot rejoin a running group.
- A leader is admitted (its warm-up gate set True) once its engine answers
  /health, its group is complete and, when warm-up has prompts, its warm-up
  (run by the reconciler, one per pod uid) verified it warm; a warm-up that
  did not verify admits or holds the replica per spec.warmup.onTimeout.
- Self-healing: a leader the health loop found unhealthy (failureThreshold
  checks in a row) is taken out of rotation first, then its whole group is
  restarted, with exponential backoff per replica and a restart budget past
  which the replica is left out of rotation and the cluster Degraded; never
  more than maxUnavailable replicas down for it, and never when two or more
  replicas fail at once on connection-level errors (the operator may be the
  one cut off)."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from shoal.controller.desired import ReplicaObjects, manifest_hash
from shoal.controller.engine_metrics import EngineMetrics
from shoal.controller.identity import Manifest
from shoal.controller.observe import Observed, PodFacts, ReplicaFacts, SetFacts
from shoal.health.assess import Assessment

# Between taking a replica out of routing and counting its in-flight requests:
# time for the routers' pod watches to see it not Ready, so no new request
# lands on it after the count.
DRAIN_GRACE_SECONDS = 5.0
# How soon to look again while waiting on an engine (health, drain).
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Desired:
    """What decisions need of a valid spec."""

    replicas: Mapping[int, ReplicaObjects]
    nodes: int  # pods per group
    max_unavailable: int
    drain_deadline_seconds: float
    warmup_enabled: bool
    # None: no warm-up to run (disabled, or no prompt source): admit on /health.
    warmup: WarmupPolicy | None = None
    # None: no self-healing (only kubelet's restarts).
    heal: HealPolicy | None = None


@dataclass(frozen=True)
class HealPolicy:
    backoff_initial_seconds: float
    backoff_max_seconds: float
    max_restarts: int
    window_seconds: float


@dataclass(frozen=True)
class WarmupPolicy:
    on_timeout: str  # Admit or Hold
    timeout_seconds: float


@dataclass(frozen=True)
class WarmupOutcome:
    """A leader's warm-up as the reconciler knows it: running, or its result."""

    running: bool
    verdict: str | None = None  # shoal.warmup.runner.Verdict value once done
    prompts_sent: int = 0
    hit_ratio: float | None = None
    duration_seconds: float = 0.0
    message: str = ""

    @property
    def warm(self) -> bool:
        return not self.running and self.verdict == "Warm"

    @property
    def unverifiable(self) -> bool:
        """Nothing to verify (no prompt, or none spans a whole KV block): admit."""
        return not self.running and self.verdict == "NothingToVerify"

    @property
    def failed(self) -> bool:
        return not self.running and not self.warm and not self.unverifiable


@dataclass(frozen=True)
class Probes:
    """Answers of leader engines, by pod uid."""

    healthy: Mapping[str, bool] = field(default_factory=dict)
    metrics: Mapping[str, EngineMetrics | None] = field(default_factory=dict)
    warmups: Mapping[str, WarmupOutcome] = field(default_factory=dict)
    health: Mapping[str, Assessment] = field(default_factory=dict)  # by leader pod uid


@dataclass(frozen=True)
class Memory:
    """What the operator remembers between passes (lost on restart, safely:
    a drain restarts its grace period, an interrupted replacement is picked up
    again from the pods' revisions)."""

    in_flight: frozenset[int] = frozenset()  # replicas being replaced
    drain_started: Mapping[int, float] = field(default_factory=dict)  # monotonic seconds
    # Self-healing: restarts made per replica (monotonic seconds), and replicas
    # out of rotation because their engine is unhealthy.
    restart_times: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    sick: frozenset[int] = frozenset()
    # Replicas failing together on connection-level errors, left alone (the
    # Event is posted when this starts, not every pass).
    unreachable: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Gate:
    pod: PodFacts
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str
    replica: int | None = None
    pod: str | None = None


@dataclass
class Decision:
    apply: list[Manifest] = field(default_factory=list)
    delete_sets: list[SetFacts] = field(default_factory=list)
    delete_pods: list[PodFacts] = field(default_factory=list)
    force_delete: list[PodFacts] = field(default_factory=list)  # grace 0: their node is lost
    gates: list[Gate] = field(default_factory=list)
    stamps: list[tuple[PodFacts, str]] = field(default_factory=list)
    warm: list[PodFacts] = field(default_factory=list)  # leaders whose warm-up to start
    events: list[Event] = field(default_factory=list)
    restarts: dict[int, str] = field(default_factory=dict)  # replica -> reason
    replacing: set[int] = field(default_factory=set)
    memory: Memory = field(default_factory=Memory)
    requeue_seconds: float | None = None
    degraded: tuple[str, str] | None = None  # reason, message
    unhealthy: set[int] = field(default_factory=set)  # out of rotation, not being restarted
    unreachable: set[int] = field(default_factory=set)  # failing together: left alone

    def poll(self, seconds: float = POLL_SECONDS) -> None:
        if self.requeue_seconds is None or seconds < self.requeue_seconds:
            self.requeue_seconds = max(seconds, 0.05)


def group_token(members: list[PodFacts]) -> str:
    """Identity of a formed group: its members' uids."""
    uids = ",".join(sorted(p.uid for p in members))
    return hashlib.sha256(uids.encode()).hexdigest()[:12]


def group_complete(replica: ReplicaFacts, nodes: int) -> bool:
    members = replica.members
    return len(members) == nodes and all(p.running for p in members)


def healthy(replica: ReplicaFacts, nodes: int) -> bool:
    """Serving: the leader Ready (warm-up gate included) and every rank running."""
    leader = replica.leader_pod
    return leader is not None and leader.ready and group_complete(replica, nodes)


def objects_outdated(replica: ReplicaFacts, objects: ReplicaObjects) -> bool:
    if replica.leader is None or replica.leader.spec_hash != manifest_hash(objects.leader):
        return True
    if objects.worker is None:
        return replica.worker is not None
    return replica.worker is None or replica.worker.spec_hash != manifest_hash(objects.worker)


def needs_replacing(replica: ReplicaFacts, objects: ReplicaObjects) -> bool:
    sets = [s for s in (replica.leader, replica.worker) if s is not None]
    return (
        objects_outdated(replica, objects)
        or not all(s.observed for s in sets)
        or bool(replica.outdated_pods())
    )


def decide(
    *,
    desired: Desired | None,
    observed: Observed,
    probes: Probes,
    memory: Memory,
    now: float,
) -> Decision:
    """desired is None for an invalid spec: then nothing is created, replaced or
    removed; running replicas are only kept admitted."""
    decision = Decision()
    existing = set(observed.replicas)
    wanted = set(desired.replicas) if desired is not None else existing
    in_flight = set(memory.in_flight) & wanted & existing
    # Pods left of a deleted StatefulSet go with it (garbage collection).
    surplus = {i for i in existing - wanted if observed.replica(i).sets}
    drain_started = {i: t for i, t in memory.drain_started.items() if i in surplus}
    if desired is not None:
        for index in sorted(surplus, reverse=True):
            _drain(decision, observed.replica(index), desired, probes, drain_started, now)
        broken = _restart_broken_groups(decision, observed, wanted & existing, desired.nodes)
        created = _create_missing(decision, observed, desired)
        _roll_out(decision, observed, desired, in_flight, skip=broken | created)
    else:
        broken = set()
    restart_times = dict(memory.restart_times)
    sick: set[int] = set()
    if desired is not None and desired.heal is not None:
        sick = heal(
            decision,
            observed,
            desired,
            desired.heal,
            probes.health,
            restart_times,
            set(memory.sick),
            now,
            skip=broken | decision.replacing,
            was_unreachable=memory.unreachable,
        )
    _admit(decision, observed, desired, probes, wanted & existing, skip=broken | sick)
    decision.memory = Memory(
        in_flight=frozenset(in_flight),
        drain_started=drain_started,
        restart_times={i: t for i, t in restart_times.items() if i in wanted},
        sick=frozenset(sick),
        unreachable=frozenset(decision.unreachable),
    )
    return decision


def restart_wait(times: tuple[float, ...], policy: HealPolicy, now: float) -> float | None:
    """Seconds until the replica may be restarted again (0: now); None once
    its restart budget for the window is spent."""
    recent = [t for t in times if now - t < policy.window_seconds]
    if len(recent) >= policy.max_restarts:
        return None
    if not recent:
        return 0.0
    factor = float(2 ** (len(recent) - 1))
    delay = min(policy.backoff_initial_seconds * factor, policy.backoff_max_seconds)
    return max(0.0, max(recent) + delay - now)


def heal(
    decision: Decision,
    observed: Observed,
    desired: Desired,
    policy: HealPolicy,
    health: Mapping[str, Assessment],
    restart_times: dict[int, tuple[float, ...]],
    sick: set[int],
    now: float,
    *,
    skip: set[int],
    was_unreachable: frozenset[int] = frozenset(),
) -> set[int]:
    """Restart unhealthy replicas within the rules; returns the replicas kept
    out of rotation for their health (not to be admitted by this pass)."""
    failing: dict[int, tuple[ReplicaFacts, Assessment]] = {}
    # Replicas whose latest check failed on a connection-level error, whether
    # or not they reached failureThreshold yet: replicas that fail together
    # reach it one check apart, and the first must not be restarted alone.
    unreachable: list[int] = []
    for index in sorted(desired.replicas):
        replica = observed.replica(index)
        leader = replica.leader_pod
        if leader is None or replica.held or index in skip or leader.terminating:
            continue
        found = health.get(leader.uid)
        if found is None or found.ok:
            continue  # not checked yet, or healthy again
        if found.connection_level:
            unreachable.append(index)
        if found.unhealthy or index in sick:
            failing[index] = (replica, found)
    if len(unreachable) >= 2 and any(i in failing for i in unreachable):
        message = (
            f"replicas {', '.join(map(str, unreachable))} fail at once on connection-level "
            "errors; the operator may be the one cut off, so none is restarted and they stay "
            "in rotation"
        )
        decision.degraded = ("ManyReplicasUnreachable", message)
        decision.unreachable = set(unreachable)
        if not was_unreachable:
            decision.events.append(Event("Warning", "ManyReplicasUnreachable", message))
        return {i for i in failing if i not in unreachable}
    exhausted = {i for i in failing if restart_wait(restart_times.get(i, ()), policy, now) is None}
    down = {
        i
        for i in desired.replicas
        if i in observed.replicas
        and i not in exhausted
        and not observed.replica(i).held
        and not healthy(observed.replica(i), desired.nodes)
    }
    keep_out: set[int] = set()
    for index, (replica, found) in sorted(failing.items()):
        leader = replica.leader_pod
        assert leader is not None
        keep_out.add(index)
        if leader.warmed != "False":
            decision.gates.append(Gate(leader, False, found.reason.value, found.detail))
        why = f"{found.reason.value}: {found.detail}"
        wait = restart_wait(restart_times.get(index, ()), policy, now)
        if wait is None:
            decision.unhealthy.add(index)
            decision.degraded = (
                "RestartBudgetExhausted",
                f"replica {index} was restarted {policy.max_restarts} times within "
                f"{policy.window_seconds:.0f}s and is still unhealthy ({why}); it is kept out "
                "of rotation and no longer restarted",
            )
            if index not in sick:
                decision.events.append(
                    Event("Warning", "RestartBudgetExhausted", decision.degraded[1], index)
                )
            continue
        if wait > 0:
            decision.unhealthy.add(index)
            decision.poll(wait)
            continue
        others = down - {index}
        if len(others) >= desired.max_unavailable:
            decision.unhealthy.add(index)
            decision.poll()
            continue
        down.add(index)
        keep_out.discard(index)
        decision.delete_pods += replica.members
        decision.restarts[index] = why
        restart_times[index] = (*restart_times.get(index, ()), now)
        decision.events.append(
            Event(
                "Warning",
                "ReplicaRestarted",
                f"restarting every pod of replica {index}: {why}",
                index,
                leader.name,
            )
        )
    return keep_out


def node_not_ready_since(nodes: list[Manifest]) -> dict[str, float]:
    """Nodes whose Ready condition is not True, and since when (epoch seconds)."""
    found: dict[str, float] = {}
    for node in nodes:
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") != "Ready" or condition.get("status") == "True":
                continue
            since = condition.get("lastTransitionTime")
            try:
                moment = datetime.datetime.fromisoformat(str(since).replace("Z", "+00:00"))
            except ValueError:
                continue
            found[node["metadata"]["name"]] = moment.timestamp()
    return found


def lose_nodes(
    decision: Decision,
    observed: Observed,
    not_ready_since: Mapping[str, float],
    *,
    now: float,
    loss_seconds: float,
) -> None:
    """Force-delete pods on nodes NotReady for longer than loss_seconds (the
    StatefulSet recreates them on a healthy node; engines keep no state). now
    is wall-clock seconds, as node conditions are."""
    for index, replica in sorted(observed.replicas.items()):
        for pod in replica.pods:
            since = not_ready_since.get(pod.node or "")
            if since is None:
                continue
            lost_for = now - since
            if lost_for < loss_seconds:
                decision.poll(loss_seconds - lost_for)
                continue
            decision.force_delete.append(pod)
            decision.events.append(
                Event(
                    "Warning",
                    "NodeLost",
                    f"force-deleting pod {pod.name} of replica {index}: node {pod.node} has "
                    f"been NotReady for {lost_for:.0f}s",
                    index,
                    pod.name,
                )
            )


def health_targets(
    observed: Observed, *, wanted: set[int], nodes: int, sick: frozenset[int]
) -> list[PodFacts]:
    """Leaders the health loop checks: admitted ones (their gate True), and
    those it took out of rotation; not ones still starting or warming."""
    targets = []
    for index, replica in sorted(observed.replicas.items()):
        leader = replica.leader_pod
        if index not in wanted or leader is None or not leader.running or replica.held:
            continue
        if not group_complete(replica, nodes) or leader.terminating:
            continue
        if leader.warmed == "True" or index in sick:
            targets.append(leader)
    return targets


def _drain(
    decision: Decision,
    replica: ReplicaFacts,
    desired: Desired,
    probes: Probes,
    started: dict[int, float],
    now: float,
) -> None:
    index, leader = replica.index, replica.leader_pod
    if index not in started:
        started[index] = now
        decision.events.append(
            Event(
                "Normal", "ReplicaDraining", f"draining replica {index} before removing it", index
            )
        )
    if leader is not None and leader.warmed != "False":
        decision.gates.append(
            Gate(leader, False, "Draining", "replica is being removed (scale down)")
        )
    elapsed = now - started[index]
    why = None
    if leader is None or not leader.running:
        why = "no engine was running"
    elif elapsed < DRAIN_GRACE_SECONDS:
        decision.poll(DRAIN_GRACE_SECONDS - elapsed)
        return
    else:
        metrics = probes.metrics.get(leader.uid)
        if metrics is None:
            why = "its engine did not answer /metrics"
        elif metrics.in_flight == 0:
            why = "its in-flight requests finished"
        elif elapsed >= desired.drain_deadline_seconds:
            why = (
                f"the drain deadline ({desired.drain_deadline_seconds:.0f}s) passed with "
                f"{metrics.in_flight:.0f} requests in flight"
            )
        else:
            decision.poll()
            return
    decision.delete_sets += [s for s in (replica.leader, replica.worker) if s is not None]
    del started[index]
    decision.events.append(
        Event("Normal", "ReplicaRemoved", f"removed replica {index}: {why}", index)
    )


def _restart_broken_groups(
    decision: Decision, observed: Observed, indices: set[int], nodes: int
) -> set[int]:
    """Restart every multi-node group that lost or restarted a member; stamp
    complete new groups with their members, so a replaced member is noticed."""
    broken: set[int] = set()
    if nodes == 1:
        return broken
    for index in sorted(indices):
        replica = observed.replica(index)
        members = replica.members
        if not members:
            continue
        token = group_token(members)
        restarted = [p.name for p in members if p.restarts > 0]
        stale = [p for p in members if p.group is not None and p.group != token]
        if restarted:
            why = f"pod {restarted[0]} restarted"
        elif stale:
            new = [p.name for p in members if p.group is None]
            why = f"pod {new[0]} replaced a member" if new else "a member pod is gone"
        else:
            if group_complete(replica, nodes):
                decision.stamps += [(p, token) for p in members if p.group != token]
            continue
        broken.add(index)
        decision.delete_pods += members
        decision.restarts[index] = why
        decision.events.append(
            Event(
                "Warning",
                "GroupRestarted",
                f"restarting every pod of replica {index}: {why}, and vLLM ranks cannot "
                "rejoin a running group",
                index,
            )
        )
    return broken


def _create_missing(decision: Decision, observed: Observed, desired: Desired) -> set[int]:
    created: set[int] = set()
    for index, objects in sorted(desired.replicas.items()):
        if observed.replica(index).leader is not None:
            continue
        created.add(index)
        decision.apply += objects.manifests
        decision.events.append(Event("Normal", "ReplicaCreated", f"created replica {index}", index))
    return created


def _roll_out(
    decision: Decision,
    observed: Observed,
    desired: Desired,
    in_flight: set[int],
    *,
    skip: set[int],
) -> None:
    existing = {i: observed.replica(i) for i in sorted(desired.replicas) if i in observed.replicas}
    for index, replica in existing.items():
        done = not needs_replacing(replica, desired.replicas[index])
        if done and healthy(replica, desired.nodes):
            in_flight.discard(index)
    unavailable = {
        i
        for i, r in existing.items()
        if not r.held and (i in in_flight or i in skip or not healthy(r, desired.nodes))
    }
    budget = desired.max_unavailable - len(unavailable)
    for index, replica in existing.items():
        objects = desired.replicas[index]
        if replica.held or index in skip or not needs_replacing(replica, objects):
            continue
        if index not in unavailable:
            if budget <= 0:
                continue
            budget -= 1
        in_flight.add(index)
        decision.replacing.add(index)
        if objects_outdated(replica, objects):
            decision.apply += objects.manifests
            if objects.worker is None and replica.worker is not None:
                decision.delete_sets.append(replica.worker)
            decision.events.append(
                Event(
                    "Normal", "ReplicaReplacing", f"replacing replica {index} (spec changed)", index
                )
            )
            continue
        sets = [s for s in (replica.leader, replica.worker) if s is not None]
        if all(s.observed for s in sets) and replica.outdated_pods():
            # The whole group: a rank from the old template could not join the new one.
            decision.delete_pods += replica.members


def _admit(
    decision: Decision,
    observed: Observed,
    desired: Desired | None,
    probes: Probes,
    indices: set[int],
    *,
    skip: set[int],
) -> None:
    deleting = {p.uid for p in decision.delete_pods}
    for index in sorted(indices):
        replica = observed.replica(index)
        leader = replica.leader_pod
        if leader is None or not leader.running or leader.uid in deleting or index in skip:
            continue
        if replica.held:
            if leader.warmed != "False":
                decision.gates.append(
                    Gate(leader, False, "Held", "the replica's StatefulSet is annotated paused")
                )
            continue
        if leader.warmed == "True":
            continue
        if desired is not None and not group_complete(replica, desired.nodes):
            continue
        if not probes.healthy.get(leader.uid):
            decision.poll()
            continue
        policy = desired.warmup if desired is not None else None
        if policy is not None:
            gate, event = warmup_gate(leader, index, policy, probes.warmups.get(leader.uid))
            if gate is None:
                if leader.uid not in probes.warmups:
                    decision.warm.append(leader)
                if not (leader.uid in probes.warmups and probes.warmups[leader.uid].failed):
                    decision.poll()
                continue
            decision.gates.append(gate)
            if event is not None:
                decision.events.append(event)
            continue
        gated = desired is not None and desired.warmup_enabled
        reason = "EngineHealthy" if gated else "WarmupDisabled"
        message = "the engine answers /health" + ("; no warm-up prompts are set" if gated else "")
        decision.gates.append(Gate(leader, True, reason, message))
        decision.events.append(
            Event(
                "Normal",
                "ReplicaAdmitted",
                f"replica {index} takes traffic: {message}",
                index,
                leader.name,
            )
        )


def warmup_gate(
    leader: PodFacts, index: int, policy: WarmupPolicy, outcome: WarmupOutcome | None
) -> tuple[Gate | None, Event | None]:
    """The gate (and Event) for a healthy leader not yet admitted: none while its
    warm-up has not started or runs; True once warm (or nothing could be
    verified); on a warm-up that did not verify, True (Admit) or False (Hold,
    set once) with a Warning."""
    if outcome is None or outcome.running:
        return None, None
    if outcome.warm or outcome.unverifiable:
        reason = "Warmed" if outcome.warm else "WarmupUnverifiable"
        message = f"warm-up: {outcome.message}"
        event = Event(
            "Normal",
            "ReplicaAdmitted",
            f"replica {index} takes traffic: {message}",
            index,
            leader.name,
        )
        return Gate(leader, True, reason, message), event
    what = f"warm-up did not verify within {policy.timeout_seconds:.0f}s: {outcome.message}"
    if policy.on_timeout == "Admit":
        message = f"{what}; admitted anyway (onTimeout: Admit)"
        event = Event(
            "Warning", "WarmupTimedOut", f"replica {index}: {message}", index, leader.name
        )
        return Gate(leader, True, "WarmupTimedOut", message), event
    if leader.warmed == "False":
        return None, None
    message = f"{what}; held out of rotation (onTimeout: Hold)"
    event = Event("Warning", "WarmupHeld", f"replica {index}: {message}", index, leader.name)
    return Gate(leader, False, "WarmupHeld", message), event


def probe_targets(
    observed: Observed, *, wanted: set[int], nodes: int | None, kv_known: set[str]
) -> tuple[list[PodFacts], list[PodFacts]]:
    """Leaders to ask /health (waiting for admission) and /metrics (draining,
    or KV pool not yet measured). An idle, admitted fleet is asked nothing."""
    health: list[PodFacts] = []
    metrics: list[PodFacts] = []
    for index, replica in sorted(observed.replicas.items()):
        leader = replica.leader_pod
        if leader is None or not leader.running:
            continue
        if index not in wanted:
            metrics.append(leader)
            continue
        if leader.uid not in kv_known:
            metrics.append(leader)
        complete = nodes is None or group_complete(replica, nodes)
        if leader.warmed != "True" and not replica.held and complete:
            health.append(leader)
    return health, metrics
