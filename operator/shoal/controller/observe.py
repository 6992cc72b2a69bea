"""The actual state of one cluster, read from its listed StatefulSets, pods and
router Deployment into plain facts (a pod's containers as kubelet reports
them included: why one waits, how it last exited, how often it restarted;
its init containers apart, as webhooks add them). Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from shoal.api.status import ConditionStatus
from shoal.controller.identity import Manifest, owned_by
from shoal.controller.names import (
    ANNOTATION_ENGINE_KEY,
    ANNOTATION_GROUP,
    ANNOTATION_PAUSED,
    ANNOTATION_SPEC_HASH,
    CONDITION_WARMED,
    LABEL_REPLICA,
    LABEL_ROLE,
    ROLE_LEADER,
    ROLE_WORKER,
)

REVISION_LABEL = "controller-revision-hash"
_Reason = TypeVar("_Reason", bound=StrEnum)


class Waiting(StrEnum):
    """Why kubelet holds a container back, for the reasons that mean trouble
    (others, such as ContainerCreating, are a normal start)."""

    CRASH_LOOP = "CrashLoopBackOff"
    PULL_ERROR = "ErrImagePull"
    PULL_BACKOFF = "ImagePullBackOff"
    INVALID_IMAGE = "InvalidImageName"
    CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_ERROR = "CreateContainerError"
    RUN_ERROR = "RunContainerError"


class Creating(StrEnum):
    """Why kubelet holds a container back while it has not created it yet: a
    normal start, trouble only when it lasts (a volume it cannot mount)."""

    CONTAINER = "ContainerCreating"
    POD_INITIALIZING = "PodInitializing"  # behind the pod's init containers


class ExitReason(StrEnum):
    """How a container last terminated, as kubelet spells the common ones."""

    COMPLETED = "Completed"
    ERROR = "Error"
    OOM_KILLED = "OOMKilled"
    OTHER = "Other"


@dataclass(frozen=True)
class ContainerFacts:
    name: str
    image: str
    running: bool
    restarts: int  # kubelet's restartCount
    waiting: Waiting | None = None  # None when running, or waiting as a start does
    waiting_message: str | None = None
    exit_code: int | None = None  # of its last termination (or its final one)
    exit_reason: ExitReason | None = None
    exit_message: str | None = None  # the termination message (a log tail, if asked for)
    started: bool = False  # kubelet's `started`: running, and past its startup probe
    init: bool = False  # an init container: it runs to completion before the engine
    creating: bool = False  # not created yet, never run (Creating)

    @property
    def crashed(self) -> bool:
        """Its last run ended in failure, and it is not running again past its
        startup probe: it waits, or its next try (which a failing engine spends
        loading, minutes on a real kubelet) has not come up yet. An engine's
        every end is a failure: its pod restarts it whatever the code (vLLM
        exits 0 on the SIGTERM of a probe that gave up on it); an init
        container's exit 0 is its success."""
        done = self.init and self.exit_reason is ExitReason.COMPLETED
        failed = self.exit_reason is not None and not done
        return (failed and not (self.running and self.started)) or (
            self.waiting is Waiting.CRASH_LOOP
        )


@dataclass(frozen=True)
class PodFacts:
    name: str
    uid: str
    replica: int
    role: str
    phase: str
    ip: str | None
    node: str | None
    terminating: bool
    ready: bool  # the Ready condition, readiness gates included
    containers_ready: bool
    warmed: ConditionStatus | None  # the warm-up gate condition's, None while absent
    restarts: int
    revision: str | None
    group: str | None
    unschedulable: str | None  # the scheduler's message, while it cannot place the pod
    gpus: int
    containers: tuple[ContainerFacts, ...] = ()
    warmed_reason: str | None = None  # why the gate was last set (a GateReason or health Reason)
    engine_key: str | None = None  # the digest of the API key it started with
    init_containers: tuple[ContainerFacts, ...] = ()  # a webhook's (Vault agent, istio-init)
    gpus_asked: int = 0  # what `gpus` will be once it is bound to a node
    scheduled_at: str | None = None  # when PodScheduled turned True (RFC 3339)
    # kubelet's or the eviction manager's why and words for the pod (Evicted, ...).
    reason: str | None = None
    message: str | None = None

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.terminating and bool(self.ip)

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"

    @property
    def container_down(self) -> bool:
        """A container of it is not up past its startup probe: kubelet starts
        or restarts it in place (the same pod)."""
        return any(not (c.running and c.started) for c in self.containers)

    @property
    def never_started(self) -> bool:
        """Pending with no container created yet, init containers included
        (none listed counts: kubelet has not reported any)."""
        every = self.init_containers + self.containers
        return self.phase == "Pending" and all(c.creating for c in every)


@dataclass(frozen=True)
class SetFacts:
    name: str
    uid: str
    replica: int
    role: str
    spec_hash: str | None
    generation: int
    observed_generation: int
    update_revision: str | None
    held: bool
    # The controller has fewer pods than the set asks for (status.replicas).
    missing_pods: bool = False
    # Why the API server refuses the set's pods (its newest FailedCreate Event).
    refused: str | None = None
    engine_key: str | None = None  # its template's key digest (ANNOTATION_ENGINE_KEY)

    @property
    def observed(self) -> bool:
        """The StatefulSet controller has seen the latest template."""
        return self.observed_generation >= self.generation and bool(self.update_revision)


@dataclass
class ReplicaFacts:
    index: int
    leader: SetFacts | None = None
    worker: SetFacts | None = None
    pods: list[PodFacts] = field(default_factory=list)

    @property
    def members(self) -> list[PodFacts]:
        """Pods of the group that are not being deleted, leader first."""
        live = [p for p in self.pods if not p.terminating]
        return sorted(live, key=lambda p: (p.role != ROLE_LEADER, p.name))

    @property
    def leader_pod(self) -> PodFacts | None:
        return next((p for p in self.members if p.role == ROLE_LEADER), None)

    @property
    def sets(self) -> list[SetFacts]:
        return [s for s in (self.leader, self.worker) if s is not None]

    @property
    def held(self) -> bool:
        return self.leader is not None and self.leader.held

    def set_for(self, role: str) -> SetFacts | None:
        return self.leader if role == ROLE_LEADER else self.worker

    def outdated_pods(self) -> list[PodFacts]:
        """Members made from an older template than their StatefulSet's."""
        outdated = []
        for pod in self.members:
            owner = self.set_for(pod.role)
            if owner is not None and owner.observed and pod.revision != owner.update_revision:
                outdated.append(pod)
        return outdated


@dataclass(frozen=True)
class RouterFacts:
    spec_hash: str | None
    available: int
    # Why the API server refuses its pods (the Deployment's ReplicaFailure).
    refused: str | None = None


@dataclass
class Observed:
    replicas: dict[int, ReplicaFacts]
    router: RouterFacts | None

    def replica(self, index: int) -> ReplicaFacts:
        return self.replicas.get(index) or ReplicaFacts(index=index)


def _annotations(obj: Manifest) -> dict[str, str]:
    annotations: dict[str, str] = obj.get("metadata", {}).get("annotations") or {}
    return annotations


def _index(obj: Manifest) -> int | None:
    value = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_REPLICA, "")
    return int(value) if value.isdigit() else None


def _condition(pod: Manifest, kind: str) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            found: dict[str, Any] = condition
            return found
    return None


def is_ready(pod: Manifest) -> bool:
    """The pod's Ready condition is True (readiness gates included): what
    `kubectl get pods` says, and what the cluster's status reports. The
    router reads kubelet's inputs instead (`router.discovery.pod_ready`),
    which go True a kubelet sync sooner and stay through a node controller's
    Ready=False."""
    return _status(_condition(pod, "Ready")) is ConditionStatus.TRUE


def _status(condition: dict[str, Any] | None) -> ConditionStatus | None:
    if condition is None:
        return None
    try:
        return ConditionStatus(str(condition.get("status")))
    except ValueError:
        return ConditionStatus.UNKNOWN


def _enum_or_none(kind: type[_Reason], value: Any) -> _Reason | None:
    try:
        return kind(str(value))
    except ValueError:
        return None


def warm_key(pod: PodFacts) -> str:
    """One run of a pod's engine: its uid and restarts. A warm-up is of one
    run: kubelet restarting the engine in place (same uid) empties its cache."""
    return f"{pod.uid}#{pod.restarts}"


def container_facts(status: Manifest, *, init: bool = False) -> ContainerFacts:
    """One entry of a pod's containerStatuses (initContainerStatuses: init)."""
    state, last = status.get("state") or {}, status.get("lastState") or {}
    waiting = state.get("waiting") or {}
    # The final termination if it is not coming back, else the last one.
    ended = state.get("terminated") or last.get("terminated") or {}
    exit_reason = None
    if ended:
        try:
            exit_reason = ExitReason(str(ended.get("reason")))
        except ValueError:
            exit_reason = ExitReason.OTHER
    code = ended.get("exitCode")
    creating = not ended and _enum_or_none(Creating, waiting.get("reason")) is not None
    return ContainerFacts(
        name=str(status.get("name", "")),
        image=str(status.get("image", "")),
        running="running" in state,
        restarts=int(status.get("restartCount", 0) or 0),
        waiting=_enum_or_none(Waiting, waiting.get("reason")) if waiting else None,
        waiting_message=waiting.get("message") or None,
        exit_code=int(code) if isinstance(code, int) else None,
        exit_reason=exit_reason,
        exit_message=ended.get("message") or None,
        started=bool(status.get("started")),
        init=init,
        creating=creating,
    )


def pod_facts(pod: Manifest, *, gpu_resource: str) -> PodFacts | None:
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    index = _index(pod)
    if index is None:
        return None
    labels = meta.get("labels") or {}
    containers_ready = _status(_condition(pod, "ContainersReady"))
    warmed = _condition(pod, CONDITION_WARMED)
    scheduled = _condition(pod, "PodScheduled")
    node = spec.get("nodeName") or None
    unschedulable, scheduled_at = None, None
    if _status(scheduled) is ConditionStatus.TRUE:
        scheduled_at = str((scheduled or {}).get("lastTransitionTime") or "") or None
    # A bound pod is scheduled, whatever its condition says: kube-scheduler
    # patches PodScheduled=False by name after a bind that failed because the
    # pod was deleted, so a StatefulSet's same-named successor, already bound,
    # can carry that stale write until its kubelet next reports.
    if scheduled and _status(scheduled) is ConditionStatus.FALSE and node is None:
        unschedulable = str(scheduled.get("message") or scheduled.get("reason") or "")
    asked = 0
    for container in spec.get("containers", []):
        limit = ((container.get("resources") or {}).get("limits") or {}).get(gpu_resource)
        asked += int(str(limit)) if str(limit or "").isdigit() else 0
    return PodFacts(
        name=meta["name"],
        uid=meta["uid"],
        replica=index,
        role=labels.get(LABEL_ROLE, ROLE_LEADER),
        phase=status.get("phase", "Pending"),
        ip=status.get("podIP") or None,
        node=node,
        terminating=bool(meta.get("deletionTimestamp")),
        ready=is_ready(pod),
        containers_ready=containers_ready is ConditionStatus.TRUE,
        warmed=_status(warmed),
        warmed_reason=str(warmed["reason"]) if warmed and warmed.get("reason") else None,
        restarts=sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or []),
        revision=labels.get(REVISION_LABEL),
        group=_annotations(pod).get(ANNOTATION_GROUP),
        engine_key=_annotations(pod).get(ANNOTATION_ENGINE_KEY),
        unschedulable=unschedulable,
        gpus=asked if node is not None else 0,
        gpus_asked=asked,
        scheduled_at=scheduled_at,
        reason=status.get("reason") or None,
        message=status.get("message") or None,
        containers=tuple(container_facts(c) for c in status.get("containerStatuses") or []),
        init_containers=tuple(
            container_facts(c, init=True) for c in status.get("initContainerStatuses") or []
        ),
    )


def set_facts(statefulset: Manifest, *, owner_uid: str | None = None) -> SetFacts | None:
    """A StatefulSet of the cluster's; None for one it does not control."""
    meta, status = statefulset["metadata"], statefulset.get("status", {})
    index = _index(statefulset)
    if index is None or (owner_uid is not None and not owned_by(statefulset, owner_uid)):
        return None
    labels = meta.get("labels") or {}
    return SetFacts(
        name=meta["name"],
        uid=meta["uid"],
        replica=index,
        role=labels.get(LABEL_ROLE, ROLE_LEADER),
        spec_hash=_annotations(statefulset).get(ANNOTATION_SPEC_HASH),
        generation=int(meta.get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        update_revision=status.get("updateRevision"),
        held=_annotations(statefulset).get(ANNOTATION_PAUSED) == "true",
        engine_key=_annotations(statefulset.get("spec", {}).get("template", {})).get(
            ANNOTATION_ENGINE_KEY
        ),
        # Once the controller has seen this generation: a set just made has
        # no pods yet and says nothing of them.
        missing_pods=int(status.get("observedGeneration", 0)) >= int(meta.get("generation", 0))
        and int(status.get("replicas", 0) or 0)
        < int(statefulset.get("spec", {}).get("replicas", 1)),
    )


def newest_message(events: list[Manifest], *, since: str) -> str | None:
    """The message of the newest of these Events (a repeated Event keeps its
    name and moves its lastTimestamp) if it is from `since` (RFC 3339, UTC)
    on; None for none."""

    def when(event: Manifest) -> str:
        stamp = event.get("lastTimestamp") or event.get("eventTime") or ""
        return str(stamp or event.get("metadata", {}).get("creationTimestamp", ""))

    newest = max(events, key=when, default=None)
    if newest is None or when(newest)[:19] < since[:19]:
        return None
    # The StatefulSet controller's "create Pod X in StatefulSet Y failed
    # error: <the API server's words>": the words.
    return str(newest.get("message", "")).split(" failed error: ", 1)[-1]


def _router_refusal(deployment: Manifest) -> str | None:
    """The Deployment's ReplicaFailure: its ReplicaSet could not make pods."""
    failure = _condition(deployment, "ReplicaFailure")
    if _status(failure) is ConditionStatus.TRUE:
        return str((failure or {}).get("message", ""))
    return None


def observe(
    *,
    statefulsets: list[Manifest],
    pods: list[Manifest],
    router: Manifest | None,
    gpu_resource: str,
    owner_uid: str | None = None,
    refusals: Mapping[str, str] | None = None,
) -> Observed:
    """owner_uid: the VLLMCluster's; StatefulSets it does not control are not
    the operator's to change, whatever their labels say. refusals: why the
    API server refuses a StatefulSet's pods, by its name."""
    replicas: dict[int, ReplicaFacts] = {}
    for statefulset in statefulsets:
        facts = set_facts(statefulset, owner_uid=owner_uid)
        if facts is None:
            continue
        if facts.missing_pods and (refused := (refusals or {}).get(facts.name)):
            facts = dataclasses.replace(facts, refused=refused)
        replica = replicas.setdefault(facts.replica, ReplicaFacts(index=facts.replica))
        if facts.role == ROLE_WORKER:
            replica.worker = facts
        else:
            replica.leader = facts
    for pod in pods:
        found = pod_facts(pod, gpu_resource=gpu_resource)
        if found is not None:
            replicas.setdefault(found.replica, ReplicaFacts(index=found.replica)).pods.append(found)
    router_facts = None
    if router is not None:
        router_facts = RouterFacts(
            spec_hash=_annotations(router).get(ANNOTATION_SPEC_HASH),
            available=int(router.get("status", {}).get("availableReplicas", 0) or 0),
            refused=_router_refusal(router),
        )
    return Observed(replicas=replicas, router=router_facts)
