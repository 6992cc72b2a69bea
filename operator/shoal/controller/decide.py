"""What to do next for one cluster: the desired fleet against the observed
one. Pure: facts, probe results, a little memory and the time in; the whole
decision (actions, events and the new memory) out. The reconciler
(`reconcile`) carries it out.

- Missing replicas are created at once; replicas the desired fleet no longer
  keeps (`retire.kept_indices`: the autoscaler's cheapest first, else the
  highest indices) are drained (out of routing first, deleted once in-flight
  requests finished or a deadline passed).
- Replicas whose manifests or pods are outdated are replaced whole (every pod
  of the group), at most rollout.maxUnavailable at a time, counting replicas
  that are already not Ready, the next only once the last is Ready again.
- A multi-node group whose member was replaced or restarted restarts whole:
  vLLM ranks cannot rejoin a running group. A member that restarted (its
  engine exited) restarts it within the heal policy's backoff and budget.
- A leader is admitted (its warm-up gate set True) once its engine answers
  /health, its group is complete and, when warm-up has prompts, its warm-up
  (run by the reconciler, one per pod uid) verified it warm; a warm-up that
  did not verify admits or holds the replica per spec.warmup.onTimeout.
- Self-healing: a leader the health loop found unhealthy (failureThreshold
  checks in a row) is taken out of rotation first, then its whole group is
  restarted, with exponential backoff per replica and a restart budget past
  which the replica is left out of rotation and the cluster Degraded; never
  more than maxUnavailable replicas restarting for it at once (a replica down
  for another reason holds none back), and never when two or more
  replicas fail at once on connection-level errors (the operator may be the
  one cut off).
- Pods on a node NotReady for longer than health.nodeLossSeconds are
  force-deleted, so their StatefulSet recreates them elsewhere.

Each step returns its part of the decision; `decide` joins them in order.
States are compared as enum members (`ConditionStatus`, `Verdict`,
`OnTimeout`), never as their text, so renaming a value cannot silently stop
admitting replicas."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum

from shoal.api.spec import OnTimeout
from shoal.api.status import ConditionReason, ConditionStatus
from shoal.controller.desired import ReplicaObjects, manifest_hash
from shoal.controller.failures import replica_failure, termination
from shoal.controller.identity import Manifest
from shoal.controller.names import FIRST_WORKER_ORDINAL, LEADER_ORDINAL, pod_name
from shoal.controller.observe import Observed, PodFacts, ReplicaFacts, SetFacts, warm_key
from shoal.controller.rollout import (
    Marks,
    RolloutPolicy,
    Stall,
    created,
    judge,
    replaced,
    stale,
    stall,
    stalled_on_spec,
)
from shoal.engine.metrics import MetricsSnapshot
from shoal.health.assess import Assessment, Reason
from shoal.warmup.verify import Verdict

# Between taking a replica out of routing and counting its in-flight requests:
# time for the routers' pod watches to see it not Ready, so no new request
# lands on it after the count.
DRAIN_GRACE_SECONDS = 5.0
# How soon to look again while waiting on an engine (health, drain).
POLL_SECONDS = 1.0
# The grace of a pod deleted to restart its replica (`delete_pods`): an
# unhealthy or broken engine has nothing to drain.
RESTART_GRACE_SECONDS = 5


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
    # None: pods on lost nodes are left to Kubernetes.
    node_loss_seconds: float | None = None
    # None: replacements are not judged (no deadline, no rollback).
    rollout: RolloutPolicy | None = None
    # By replica: its last good template, to give back if its new one cannot run.
    fallback: Mapping[int, ReplicaObjects] = field(default_factory=dict)


@dataclass(frozen=True)
class HealPolicy:
    backoff_initial_seconds: float
    backoff_max_seconds: float
    max_restarts: int
    window_seconds: float


@dataclass(frozen=True)
class WarmupPolicy:
    on_timeout: OnTimeout
    timeout_seconds: float


@dataclass(frozen=True)
class WarmupOutcome:
    """A leader's warm-up as the reconciler knows it: running, or its result."""

    running: bool
    verdict: Verdict | None = None  # once done
    prompts_sent: int = 0
    hit_ratio: float | None = None
    duration_seconds: float = 0.0
    message: str = ""

    @property
    def warm(self) -> bool:
        return not self.running and self.verdict is Verdict.WARM

    @property
    def unverifiable(self) -> bool:
        """Nothing to verify (no prompt, or none spans a whole KV block): admit."""
        return not self.running and self.verdict is Verdict.NOTHING_TO_VERIFY

    @property
    def failed(self) -> bool:
        return not self.running and not self.warm and not self.unverifiable


@dataclass(frozen=True)
class Probes:
    """Answers of leader engines, by pod uid."""

    healthy: Mapping[str, bool] = field(default_factory=dict)
    metrics: Mapping[str, MetricsSnapshot | None] = field(default_factory=dict)
    warmups: Mapping[str, WarmupOutcome] = field(default_factory=dict)  # by warm_key
    health: Mapping[str, Assessment] = field(default_factory=dict)  # by leader pod uid


@dataclass(frozen=True)
class NotReadyNodes:
    """Nodes whose Ready condition is not True, and since when; wall-clock
    seconds, as node conditions are, with the wall clock read with them."""

    since: Mapping[str, float] = field(default_factory=dict)
    now: float = 0.0


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
    # Replicas still failing when such an outage ended, with their count of
    # failed checks then: the network comes back to replicas a check or so
    # apart, so they are judged on the checks after it only.
    after_outage: Mapping[int, int] = field(default_factory=dict)
    # Replicas restarted for their health that do not serve again yet: they
    # count against maxUnavailable for the next restart (others down, such as
    # one waiting for GPUs, do not: a replica out of rotation costs no
    # capacity to restart).
    restarting: frozenset[int] = frozenset()


class GateReason(StrEnum):
    """Why the warm-up gate was set (besides a health Reason, which takes a
    replica out of rotation under its own name)."""

    DRAINING = "Draining"
    HELD = "Held"
    ENGINE_HEALTHY = "EngineHealthy"
    WARMUP_DISABLED = "WarmupDisabled"
    WARMED = "Warmed"
    WARMUP_UNVERIFIABLE = "WarmupUnverifiable"
    WARMUP_TIMED_OUT = "WarmupTimedOut"
    WARMUP_HELD = "WarmupHeld"
    ENGINE_RESTARTED = "EngineRestarted"
    GROUP_BROKEN = "GroupBroken"  # a member restarted; the group's restart waits its backoff


@dataclass(frozen=True, kw_only=True)
class Gate:
    """The warm-up gate to set on a leader: True admits it to traffic."""

    pod: PodFacts
    status: bool
    reason: GateReason | Reason
    message: str


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """Reasons of Events that tell the fleet's story (docs/troubleshooting.md
    names each). Other Events carry a condition's, a gate's or the
    autoscaler's reason."""

    CHILD_RESTORED = "ChildRestored"
    DRIFT_REVERTED = "DriftReverted"
    REPLICA_CREATED = "ReplicaCreated"
    REPLICA_REMOVED = "ReplicaRemoved"
    REPLICA_REPLACING = "ReplicaReplacing"
    REPLICA_DRAINING = "ReplicaDraining"
    REPLICA_ADMITTED = "ReplicaAdmitted"
    REPLICA_RESTARTED = "ReplicaRestarted"
    GROUP_RESTARTED = "GroupRestarted"
    NODE_LOST = "NodeLost"


@dataclass(frozen=True)
class Event:
    type: EventType
    # A StrEnum of its own kind: EventReason, ConditionReason, GateReason or the
    # autoscaler's ScaleReason.
    reason: StrEnum
    message: str
    _: KW_ONLY
    replica: int | None = None
    pod: str | None = None


@dataclass
class Decision:
    apply: list[Manifest] = field(default_factory=list)
    delete_sets: list[SetFacts] = field(default_factory=list)
    delete_pods: list[PodFacts] = field(default_factory=list)  # restarts: RESTART_GRACE_SECONDS
    # Serving replicas' outdated pods (a rollout): deleted with their own
    # grace, which covers spec.engine.shutdownTimeoutSeconds, so they drain.
    replace_pods: list[PodFacts] = field(default_factory=list)
    force_delete: list[PodFacts] = field(default_factory=list)  # grace 0: their node is lost
    gates: list[Gate] = field(default_factory=list)
    stamps: list[tuple[PodFacts, str]] = field(default_factory=list)
    warm: list[PodFacts] = field(default_factory=list)  # leaders whose warm-up to start
    events: list[Event] = field(default_factory=list)
    restarts: dict[int, str] = field(default_factory=dict)  # replica -> reason
    replacing: set[int] = field(default_factory=set)
    memory: Memory = field(default_factory=Memory)
    requeue_seconds: float | None = None
    degraded: tuple[ConditionReason, str] | None = None  # reason, message
    unhealthy: set[int] = field(default_factory=set)  # out of rotation, not being restarted
    unreachable: set[int] = field(default_factory=set)  # failing together: left alone
    # Rollout marks to write on leader StatefulSets (by name): with their apply
    # when they are applied, else as a patch.
    marks: dict[str, Marks] = field(default_factory=dict)
    stall: Stall | None = None  # the rollout's pause in force

    def poll(self, seconds: float = POLL_SECONDS) -> None:
        if self.requeue_seconds is None or seconds < self.requeue_seconds:
            self.requeue_seconds = max(seconds, 0.05)


def joined(parts: Iterable[Decision]) -> Decision:
    """Parts of a decision as one, in order: lists concatenated, sets and
    restarts merged, the soonest requeue, the last Degraded reason."""
    whole = Decision()
    for part in parts:
        whole.apply += part.apply
        whole.delete_sets += part.delete_sets
        whole.delete_pods += part.delete_pods
        whole.replace_pods += part.replace_pods
        whole.force_delete += part.force_delete
        whole.gates += part.gates
        whole.stamps += part.stamps
        whole.warm += part.warm
        whole.events += part.events
        whole.restarts.update(part.restarts)
        whole.replacing |= part.replacing
        whole.unhealthy |= part.unhealthy
        whole.unreachable |= part.unreachable
        whole.marks.update(part.marks)
        if part.stall is not None:
            whole.stall = part.stall
        if part.degraded is not None:
            whole.degraded = part.degraded
        if part.requeue_seconds is not None:
            whole.poll(part.requeue_seconds)
    return whole


def group_token(members: list[PodFacts]) -> str:
    """Identity of a formed group: its members' uids."""
    uids = ",".join(sorted(p.uid for p in members))
    return hashlib.sha256(uids.encode()).hexdigest()[:12]


def member_names(replica: ReplicaFacts, nodes: int) -> list[str]:
    """The pods a complete group has, by its StatefulSets' names."""
    names = [] if replica.leader is None else [pod_name(replica.leader.name, LEADER_ORDINAL)]
    if replica.worker is not None:
        last = FIRST_WORKER_ORDINAL + nodes - 1
        names += [pod_name(replica.worker.name, k) for k in range(FIRST_WORKER_ORDINAL, last)]
    return names


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
    nodes: NotReadyNodes | None = None,
) -> Decision:
    """desired is None for an invalid spec: then nothing is created, replaced or
    removed; running replicas are only kept admitted. now is monotonic seconds;
    nodes, the NotReady nodes holding the cluster's pods (None: none known)."""
    existing = set(observed.replicas)
    wanted = set(desired.replicas) if desired is not None else existing
    in_flight = frozenset(memory.in_flight & wanted & existing)
    parts: list[Decision] = []
    drain_started: dict[int, float] = {}
    broken: set[int] = set()
    held: set[int] = set()
    replacing: set[int] = set()
    restart_times = dict(memory.restart_times)
    if desired is not None:
        # Pods left of a deleted StatefulSet go with it (garbage collection).
        surplus = {i for i in existing - wanted if observed.replica(i).sets}
        for index in sorted(surplus, reverse=True):
            drained, started = _drain(
                observed.replica(index),
                desired,
                probes=probes,
                started=memory.drain_started.get(index),
                now=now,
            )
            parts.append(drained)
            if started is not None:
                drain_started[index] = started
        restarted = _restart_broken_groups(
            observed,
            indices=wanted & existing,
            nodes=desired.nodes,
            policy=desired.heal,
            times=restart_times,
            now=now,
        )
        broken = set(restarted.restarts)
        # Held back: not restarted, healed or admitted; a rollout may replace them.
        held = restarted.unhealthy
        missing = {i for i in desired.replicas if observed.replica(i).leader is None}
        rolled, in_flight = _roll_out(observed, desired, in_flight=in_flight, skip=broken | missing)
        replacing = rolled.replacing
        parts += [restarted, _create_missing(desired, missing), rolled]
    # Without a valid spec nothing is judged: those out for health stay so.
    sick: frozenset[int] = memory.sick if desired is None else frozenset()
    restarting = memory.restarting if desired is None else frozenset()
    after_outage: Mapping[int, int] = {}
    if desired is not None and desired.heal is not None:
        healing = heal(
            observed,
            desired,
            policy=desired.heal,
            health=probes.health,
            memory=dataclasses.replace(memory, restart_times=restart_times),
            now=now,
            skip=broken | replacing | held,
        )
        parts.append(healing.decision)
        restart_times, sick = dict(healing.restart_times), healing.keep_out
        after_outage, restarting = healing.after_outage, healing.restarting
    deleting = {p.uid for part in parts for p in (*part.delete_pods, *part.replace_pods)}
    parts.append(
        _admit(
            observed,
            desired,
            probes=probes,
            indices=wanted & existing,
            skip=broken | sick | held,
            deleting=deleting,
        )
    )
    if desired is not None and desired.node_loss_seconds is not None and nodes is not None:
        parts.append(lose_nodes(observed, nodes, loss_seconds=desired.node_loss_seconds))
    decision = joined(parts)
    return dataclasses.replace(
        decision,
        memory=Memory(
            in_flight=in_flight,
            drain_started=drain_started,
            restart_times={i: t for i, t in restart_times.items() if i in wanted},
            sick=sick,
            unreachable=frozenset(decision.unreachable),
            after_outage=after_outage,
            restarting=restarting,
        ),
    )


def restart_wait(times: tuple[float, ...], policy: HealPolicy, *, now: float) -> float | None:
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


@dataclass(frozen=True)
class Healing:
    decision: Decision
    keep_out: frozenset[int]  # out of rotation for their health: not admitted this pass
    restart_times: Mapping[int, tuple[float, ...]]  # with the restarts decided now
    after_outage: Mapping[int, int] = field(default_factory=dict)  # the next Memory's
    restarting: frozenset[int] = frozenset()  # the next Memory's


def heal(
    observed: Observed,
    desired: Desired,
    *,
    policy: HealPolicy,
    health: Mapping[str, Assessment],
    memory: Memory,
    now: float,
    skip: set[int],
) -> Healing:
    """Restart unhealthy replicas within the rules, and keep out of rotation
    those not restarted now."""
    part = Decision()
    restart_times = dict(memory.restart_times)
    checked: dict[int, tuple[ReplicaFacts, Assessment]] = {}  # failing their latest check
    unchecked: set[int] = set()  # out for their health, no check since: they stay out
    for index in sorted(desired.replicas):
        replica = observed.replica(index)
        leader = replica.leader_pod
        if leader is None or replica.held or index in skip or leader.terminating:
            continue
        if leader.container_down:
            continue  # kubelet restarts it: a check of ours now would only count that
        found = health.get(leader.uid)
        if found is not None and not found.ok:  # else not checked yet, or healthy again
            checked[index] = (replica, found)
        elif found is None and index in memory.sick:
            unchecked.add(index)  # out for its health, not checked since (a new process)
    # Replicas whose latest check failed on a connection-level error, whether
    # or not they reached failureThreshold yet: replicas that fail together
    # reach it one check apart, and the first must not be restarted alone.
    unreachable = [i for i, (_, found) in checked.items() if found.connection_level]
    if len(unreachable) >= 2 and any(
        checked[i][1].unhealthy or i in memory.sick for i in unreachable
    ):
        message = (
            f"replicas {', '.join(map(str, unreachable))} fail at once on connection-level "
            "errors (/health refused or unanswered); the operator may be the one cut off, so "
            "none is restarted and they stay in rotation"
        )
        part.degraded = (ConditionReason.MANY_REPLICAS_UNREACHABLE, message)
        part.unreachable = set(unreachable)
        if not memory.unreachable:
            part.events.append(
                Event(EventType.WARNING, ConditionReason.MANY_REPLICAS_UNREACHABLE, message)
            )
        keep_out = frozenset(
            i
            for i, (_, found) in checked.items()
            if i not in unreachable and (found.unhealthy or i in memory.sick)
        ) | frozenset(unchecked)
        return Healing(
            decision=part,
            keep_out=keep_out,
            restart_times=restart_times,
            restarting=memory.restarting,
        )
    after_outage = _after_outage(checked, memory)
    failing = {
        i: facts
        for i, facts in checked.items()
        if facts[1].unhealthy_after(after_outage.get(i, 0)) or i in memory.sick
    }
    if set(after_outage) - set(failing):
        part.poll()  # the health loop wakes a pass on changes only, not on each count
    exhausted = {
        i for i in failing if restart_wait(restart_times.get(i, ()), policy, now=now) is None
    }
    down = {
        i
        for i in memory.restarting & set(desired.replicas)
        if i in observed.replicas
        and i not in exhausted
        and not observed.replica(i).held
        and not healthy(observed.replica(i), desired.nodes)
    }
    kept_out: set[int] = set()
    for index, (replica, found) in sorted(failing.items()):
        leader = replica.leader_pod
        assert leader is not None
        kept_out.add(index)
        if leader.warmed is not ConditionStatus.FALSE:
            part.gates.append(
                Gate(pod=leader, status=False, reason=found.reason, message=found.detail)
            )
        why = f"{found.reason}: {found.detail}"
        wait = restart_wait(restart_times.get(index, ()), policy, now=now)
        if wait is None:
            part.unhealthy.add(index)
            _budget_spent(
                part,
                index,
                message=f"replica {index} was restarted {policy.max_restarts} times within "
                f"{policy.window_seconds:.0f}s and is still unhealthy ({why}); it is kept out "
                "of rotation and no longer restarted",
                first=index not in memory.sick,
            )
            continue
        if wait > 0:
            part.unhealthy.add(index)
            part.poll(wait)
            continue
        others = down - {index}
        if len(others) >= desired.max_unavailable:
            part.unhealthy.add(index)
            part.poll()
            continue
        down.add(index)
        kept_out.discard(index)
        part.delete_pods += replica.members
        part.restarts[index] = why
        restart_times[index] = (*restart_times.get(index, ()), now)
        part.events.append(
            Event(
                EventType.WARNING,
                EventReason.REPLICA_RESTARTED,
                f"restarting every pod of replica {index}: {why}",
                replica=index,
                pod=leader.name,
            )
        )
    return Healing(
        decision=part,
        keep_out=frozenset(kept_out | unchecked),
        restart_times=restart_times,
        after_outage=after_outage,
        restarting=frozenset(down),
    )


def _after_outage(
    checked: Mapping[int, tuple[ReplicaFacts, Assessment]], memory: Memory
) -> dict[int, int]:
    """Memory.after_outage for the replicas still failing: kept while they fail
    on, set for those a shared outage left failing as it ended."""
    found: dict[int, int] = {}
    for index, (_, assessment) in checked.items():
        since = memory.after_outage.get(index)
        if since is not None and since <= assessment.consecutive:
            found[index] = since
        elif index in memory.unreachable:
            found[index] = assessment.consecutive
    return found


def node_not_ready_since(nodes: list[Manifest]) -> dict[str, float]:
    """Nodes whose Ready condition is not True, and since when (epoch seconds)."""
    found: dict[str, float] = {}
    for node in nodes:
        for condition in (node.get("status") or {}).get("conditions") or []:
            ready = condition.get("status") == ConditionStatus.TRUE
            if condition.get("type") != "Ready" or ready:
                continue
            since = condition.get("lastTransitionTime")
            try:
                moment = datetime.datetime.fromisoformat(str(since).replace("Z", "+00:00"))
            except ValueError:
                continue
            found[node["metadata"]["name"]] = moment.timestamp()
    return found


def lose_nodes(observed: Observed, nodes: NotReadyNodes, *, loss_seconds: float) -> Decision:
    """Force-delete pods on nodes NotReady for longer than loss_seconds (the
    StatefulSet recreates them on a healthy node; engines keep no state)."""
    part = Decision()
    for index, replica in sorted(observed.replicas.items()):
        for pod in replica.pods:
            since = nodes.since.get(pod.node or "")
            if since is None:
                continue
            lost_for = nodes.now - since
            if lost_for < loss_seconds:
                part.poll(loss_seconds - lost_for)
                continue
            part.force_delete.append(pod)
            part.events.append(
                Event(
                    EventType.WARNING,
                    EventReason.NODE_LOST,
                    f"force-deleting pod {pod.name} of replica {index}: node {pod.node} has "
                    f"been NotReady for {lost_for:.0f}s",
                    replica=index,
                    pod=pod.name,
                )
            )
    return part


def out_for_health(observed: Observed) -> frozenset[int]:
    """Replicas whose leader's gate a health check set False: a new operator
    process's Memory.sick (an earlier one's is gone with it)."""
    failures = {str(r) for r in Reason if r is not Reason.HEALTHY}
    return frozenset(
        index
        for index, replica in observed.replicas.items()
        if (leader := replica.leader_pod) is not None
        and leader.warmed is ConditionStatus.FALSE
        and leader.warmed_reason in failures
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
        if not group_complete(replica, nodes) or leader.terminating or leader.container_down:
            continue
        if leader.warmed is ConditionStatus.TRUE or index in sick:
            targets.append(leader)
    return targets


def _drain(
    replica: ReplicaFacts,
    desired: Desired,
    *,
    probes: Probes,
    started: float | None,
    now: float,
) -> tuple[Decision, float | None]:
    """Drain a surplus replica, and when its drain started (None once removed)."""
    part = Decision()
    index, leader = replica.index, replica.leader_pod
    if started is None:
        started = now
        part.events.append(
            Event(
                EventType.NORMAL,
                EventReason.REPLICA_DRAINING,
                f"draining replica {index} before removing it",
                replica=index,
            )
        )
    if leader is not None and leader.warmed is not ConditionStatus.FALSE:
        part.gates.append(
            Gate(
                pod=leader,
                status=False,
                reason=GateReason.DRAINING,
                message="replica is being removed (scale down)",
            )
        )
    elapsed = now - started
    why = None
    if leader is None or not leader.running:
        why = "no engine was running"
    elif elapsed < DRAIN_GRACE_SECONDS:
        part.poll(DRAIN_GRACE_SECONDS - elapsed)
        return part, started
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
            part.poll()
            return part, started
    part.delete_sets += replica.sets
    part.events.append(
        Event(
            EventType.NORMAL,
            EventReason.REPLICA_REMOVED,
            f"removing replica {index}: {why}",
            replica=index,
        )
    )
    return part, None


def _restart_broken_groups(
    observed: Observed,
    *,
    indices: set[int],
    nodes: int,
    policy: HealPolicy | None,
    times: dict[int, tuple[float, ...]],
    now: float,
) -> Decision:
    """Restart every multi-node group that lost or restarted a member; stamp
    complete new groups with their members, so a replaced member is noticed.
    The groups restarted are the part's `restarts`. A member that restarted
    (its engine exited) restarts its group within the heal policy's backoff
    and budget, which `times` (restarts by replica) records: each restart
    makes new pods, so kubelet's own back-off never starts, and a member
    crashing at start-up would have its group made again as fast as it
    crashed. A group held back is the part's `unhealthy`, out of rotation."""
    part = Decision()
    if nodes == 1:
        return part
    for index in sorted(indices):
        replica = observed.replica(index)
        members = replica.members
        if not members:
            continue
        token = group_token(members)
        restarted = [p for p in members if p.restarts > 0]
        stale = [p for p in members if p.group is not None and p.group != token]
        if restarted:
            how = [t for c in restarted[0].containers if (t := termination(c)) is not None]
            why = f"pod {restarted[0].name} restarted" + (f" ({how[0]})" if how else "")
            if policy is not None:
                wait = restart_wait(times.get(index, ()), policy, now=now)
                if wait != 0.0:
                    _hold_group(part, replica, why=why, policy=policy, wait=wait)
                    continue
                times[index] = (*times.get(index, ()), now)
        elif stale:
            new = [p.name for p in members if p.group is None]
            gone = sorted(set(member_names(replica, nodes)) - {p.name for p in members})
            if new:
                why = f"pod {new[0]} replaced a member"
            else:
                why = f"pod {gone[0]} is gone" if gone else "a member pod is gone"
        else:
            if group_complete(replica, nodes):
                part.stamps += [(p, token) for p in members if p.group != token]
            continue
        part.delete_pods += members
        part.restarts[index] = why
        part.events.append(
            Event(
                EventType.WARNING,
                EventReason.GROUP_RESTARTED,
                f"restarting every pod of replica {index}: {why}, and vLLM ranks cannot "
                "rejoin a running group",
                replica=index,
            )
        )
    return part


def _hold_group(
    part: Decision, replica: ReplicaFacts, *, why: str, policy: HealPolicy, wait: float | None
) -> None:
    """A broken group not restarted yet (wait: its backoff's seconds left) or
    any more (None: its budget spent): out of rotation meanwhile."""
    index, leader = replica.index, replica.leader_pod
    part.unhealthy.add(index)
    first = leader is not None and leader.warmed is not ConditionStatus.FALSE
    if leader is not None and first:
        part.gates.append(
            Gate(pod=leader, status=False, reason=GateReason.GROUP_BROKEN, message=why)
        )
    if wait is not None:
        part.poll(wait)
        return
    _budget_spent(
        part,
        index,
        message=f"replica {index}'s group was restarted {policy.max_restarts} times within "
        f"{policy.window_seconds:.0f}s and {why} again; it is kept out of rotation and no "
        "longer restarted",
        first=first,
    )


def _budget_spent(part: Decision, index: int, *, message: str, first: bool) -> None:
    """Degraded RestartBudgetExhausted, and its Event the first time."""
    part.degraded = (ConditionReason.RESTART_BUDGET_EXHAUSTED, message)
    if first:
        part.events.append(
            Event(
                EventType.WARNING, ConditionReason.RESTART_BUDGET_EXHAUSTED, message, replica=index
            )
        )


def _create_missing(desired: Desired, missing: set[int]) -> Decision:
    part = Decision()
    for index in sorted(missing):
        objects = desired.replicas[index]
        part.apply += objects.manifests
        if desired.rollout is not None:
            part.marks[_name(objects.leader)] = created(desired.rollout)
        part.events.append(
            Event(
                EventType.NORMAL,
                EventReason.REPLICA_CREATED,
                f"creating replica {index}",
                replica=index,
            )
        )
    return part


def _name(manifest: Manifest) -> str:
    return str(manifest["metadata"]["name"])


def _roll_out(
    observed: Observed,
    desired: Desired,
    *,
    in_flight: frozenset[int],
    skip: set[int],
) -> tuple[Decision, frozenset[int]]:
    """Replace outdated replicas within the budget, unless the rollout is
    paused; give replacements that cannot run their last good template back;
    also the replicas being replaced once this part is carried out."""
    part = Decision()
    replacing = set(in_flight)
    existing = {i: observed.replica(i) for i in sorted(desired.replicas) if i in observed.replicas}
    for index, replica in existing.items():
        done = not needs_replacing(replica, desired.replicas[index])
        if done and healthy(replica, desired.nodes):
            replacing.discard(index)
    judged = _judge_replacements(existing, desired, skip=skip)
    part.stall = judged.stall
    replacing |= judged.replacing
    unavailable = {
        i
        for i, r in existing.items()
        if not r.held and (i in replacing or i in skip or not healthy(r, desired.nodes))
    }
    budget = desired.max_unavailable - len(unavailable)
    for index, replica in existing.items():
        objects = desired.replicas[index]
        if replica.held or index in skip or index in judged.replacing:
            continue
        if not needs_replacing(replica, objects):
            continue
        outdated = objects_outdated(replica, objects)
        going_back = desired.rollout is not None and stalled_on_spec(desired.rollout, index)
        if outdated and part.stall is not None and not going_back:
            continue  # paused: no new template goes out while the spec is the one that stalled
        if index not in unavailable:
            if budget <= 0:
                continue
            budget -= 1
        replacing.add(index)
        part.replacing.add(index)
        if outdated:
            part.apply += objects.manifests
            if desired.rollout is not None:
                serving = healthy(replica, desired.nodes)
                marks = replaced(desired.rollout, index, serving=serving)
                part.marks[_name(objects.leader)] = marks
            if objects.worker is None and replica.worker is not None:
                part.delete_sets.append(replica.worker)
            part.events.append(
                Event(
                    EventType.NORMAL,
                    EventReason.REPLICA_REPLACING,
                    f"replacing replica {index} (its template changed: the spec, or the "
                    "engines' API key)",
                    replica=index,
                )
            )
            continue
        if all(s.observed for s in replica.sets) and replica.outdated_pods():
            # The whole group: a rank from the old template could not join the
            # new one. One that serves drains; one that does not has nothing to.
            if healthy(replica, desired.nodes):
                part.replace_pods += replica.members
            else:
                part.delete_pods += replica.members
    part.apply += judged.apply
    part.delete_sets += judged.delete_sets
    part.marks.update(judged.marks)
    part.events += judged.events
    part.replacing |= judged.replacing
    if judged.requeue_seconds is not None:
        part.poll(judged.requeue_seconds)
    return part, frozenset(replacing)


def _judge_replacements(
    existing: Mapping[int, ReplicaFacts], desired: Desired, *, skip: set[int]
) -> Decision:
    """Replacements not yet warm: rolled back when they cannot run or their
    deadline passed (the part's `replacing`), and the pause that follows;
    finished ones and stale pauses get their marks rewritten."""
    part = Decision()
    policy = desired.rollout
    if policy is None:
        return part
    part.stall = stall(policy)
    for index, replica in existing.items():
        objects = desired.replicas[index]
        if replica.held or replica.leader is None:
            continue
        up_to_date = not objects_outdated(replica, objects)
        # On its template: a pod of the old one still Ready is not the replacement serving.
        serving = healthy(replica, desired.nodes) and not needs_replacing(replica, objects)
        failure = replica_failure(replica)
        fallback = desired.fallback.get(index)
        verdict = judge(
            policy,
            index,
            up_to_date=up_to_date,
            serving=serving,
            cannot_run=failure.message if failure is not None else None,
            has_fallback=fallback is not None,
        )
        if verdict.wait_seconds is not None:
            part.poll(verdict.wait_seconds)
        marks = verdict.marks or stale(policy, index, up_to_date=up_to_date, serving=serving)
        if marks is None:
            continue
        name = _name(objects.leader)
        part.marks[name] = marks
        if not verdict.stall:
            continue
        part.stall = Stall(
            index,
            ConditionReason.ROLLED_BACK if verdict.roll_back else ConditionReason.ROLLOUT_STALLED,
            verdict.message,
        )
        part.events.append(
            Event(EventType.WARNING, part.stall.state, verdict.message, replica=index)
        )
        if verdict.roll_back and fallback is not None:
            part.replacing.add(index)
            part.apply += fallback.manifests
            part.marks[_name(fallback.leader)] = marks
            if fallback.worker is None and replica.worker is not None:
                part.delete_sets.append(replica.worker)
    return part


def _admit(
    observed: Observed,
    desired: Desired | None,
    *,
    probes: Probes,
    indices: set[int],
    skip: set[int],
    deleting: set[str],
) -> Decision:
    """Gates of leaders not being deleted (by pod uid) or skipped."""
    part = Decision()
    for index in sorted(indices):
        replica = observed.replica(index)
        leader = replica.leader_pod
        if leader is None or not leader.running or leader.uid in deleting or index in skip:
            continue
        if replica.held:
            if leader.warmed is not ConditionStatus.FALSE:
                part.gates.append(
                    Gate(
                        pod=leader,
                        status=False,
                        reason=GateReason.HELD,
                        message="the replica's StatefulSet is annotated paused",
                    )
                )
            continue
        if leader.warmed is ConditionStatus.TRUE:
            if leader.container_down:
                # kubelet restarts its engine in place: it comes back cold, so
                # out of rotation until it is warmed again.
                part.gates.append(
                    Gate(
                        pod=leader,
                        status=False,
                        reason=GateReason.ENGINE_RESTARTED,
                        message="kubelet restarts the engine's container; it is warmed "
                        "again before it takes traffic",
                    )
                )
            continue
        if desired is None:
            # No spec to judge it by: a replica taken out of rotation (for its
            # health, a failed warm-up, a drain) stays out until there is one.
            if leader.warmed is ConditionStatus.FALSE:
                continue
        elif not group_complete(replica, desired.nodes):
            continue
        if not probes.healthy.get(leader.uid):
            part.poll()
            continue
        policy = desired.warmup if desired is not None else None
        if policy is not None:
            outcome = probes.warmups.get(warm_key(leader))
            gate, event = warmup_gate(leader, index=index, policy=policy, outcome=outcome)
            if gate is None:
                if outcome is None:
                    part.warm.append(leader)
                if outcome is None or not outcome.failed:
                    part.poll()
                continue
            part.gates.append(gate)
            if event is not None:
                part.events.append(event)
            continue
        gated = desired is not None and desired.warmup_enabled
        reason = GateReason.ENGINE_HEALTHY if gated else GateReason.WARMUP_DISABLED
        message = "the engine answers /health" + ("; no warm-up prompts are set" if gated else "")
        part.gates.append(Gate(pod=leader, status=True, reason=reason, message=message))
        part.events.append(
            Event(
                EventType.NORMAL,
                EventReason.REPLICA_ADMITTED,
                f"replica {index} takes traffic: {message}",
                replica=index,
                pod=leader.name,
            )
        )
    return part


def warmup_gate(
    leader: PodFacts, *, index: int, policy: WarmupPolicy, outcome: WarmupOutcome | None
) -> tuple[Gate | None, Event | None]:
    """The gate (and Event) for a healthy leader not yet admitted: none while its
    warm-up has not started or runs; True once warm (or nothing could be
    verified); on a warm-up that did not verify, True (Admit) or False (Hold,
    set once) with a Warning."""
    if outcome is None or outcome.running:
        return None, None
    if outcome.warm or outcome.unverifiable:
        reason = GateReason.WARMED if outcome.warm else GateReason.WARMUP_UNVERIFIABLE
        message = f"warm-up: {outcome.message}"
        event = Event(
            EventType.NORMAL,
            EventReason.REPLICA_ADMITTED,
            f"replica {index} takes traffic: {message}",
            replica=index,
            pod=leader.name,
        )
        return Gate(pod=leader, status=True, reason=reason, message=message), event
    what = f"warm-up did not verify within {policy.timeout_seconds:.0f}s: {outcome.message}"
    if policy.on_timeout is OnTimeout.ADMIT:
        message = f"{what}; admitted anyway (onTimeout: {OnTimeout.ADMIT})"
        event = Event(
            EventType.WARNING,
            GateReason.WARMUP_TIMED_OUT,
            f"replica {index}: {message}",
            replica=index,
            pod=leader.name,
        )
        gate = Gate(pod=leader, status=True, reason=GateReason.WARMUP_TIMED_OUT, message=message)
        return gate, event
    if leader.warmed is ConditionStatus.FALSE:
        return None, None
    message = f"{what}; held out of rotation (onTimeout: {OnTimeout.HOLD})"
    event = Event(
        EventType.WARNING,
        GateReason.WARMUP_HELD,
        f"replica {index}: {message}",
        replica=index,
        pod=leader.name,
    )
    return Gate(pod=leader, status=False, reason=GateReason.WARMUP_HELD, message=message), event


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
        if leader.warmed is not ConditionStatus.TRUE and not replica.held and complete:
            health.append(leader)
    return health, metrics
