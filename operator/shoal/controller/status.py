"""A cluster's status from what was observed and decided. Pure.

Only facts that change on transitions go here (live load belongs in metrics),
so the reconciler writes status only when this result differs from the last.

Why a replica does not run, from its pods: the scheduler cannot place one, one
failed, a container of one fails (its init containers first: the engine waits
for them), or one has created no container long after it was scheduled. Each
names the replica, the pod and what to do, in Degraded and in the replica's
entry."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shoal.api.cache import DownloadState, ModelStatus
from shoal.api.capacity import plan_spec
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import (
    REPLICA_MESSAGE_CHARS,
    CapacityStatus,
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    MeasuredKV,
    ReplicaState,
    ReplicaStatus,
    VLLMClusterStatus,
)
from shoal.api.validation import SpecError
from shoal.controller.cache import Download, download_status
from shoal.controller.decide import Decision, Event, EventType, Memory, Probes, group_complete
from shoal.controller.engine import nodes_per_replica
from shoal.controller.failures import (
    Failure,
    container_failure,
    last_line,
    last_termination,
    pod_failure,
    refused_pods,
)
from shoal.controller.names import ANNOTATION_PAUSED, leader_selector_text, router_name
from shoal.controller.observe import (
    ContainerFacts,
    ExitReason,
    Observed,
    PodFacts,
    ReplicaFacts,
    warm_key,
)
from shoal.controller.restarts import recent_restarts, wall_seconds
from shoal.engine.metrics import KVPool

# Scheduled this long with no container created yet, a pod is stuck (its
# Events say why). A pull of vLLM's image, ~10 GB, shows as ContainerCreating
# too, minutes on a cold node: the bound is above that.
POD_STUCK_SECONDS = 600
# Kubelet's or the scheduler's words quoted in a message: room left for the fix.
_WORDS_CHARS = 600

# (the scheduler's words, what to change), every one that matches; the GPUs
# (Insufficient <gpu.resource>) are _unschedulable's.
_PLACEMENT_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"didn't match (Pod's )?node (affinity|selector)"),
        "no node has the labels asked for: check spec.gpu.product (the node label "
        "nvidia.com/gpu.product), spec.placement.nodeSelector and spec.placement.affinity",
    ),
    (
        re.compile(r"untolerated taint|didn't tolerate"),
        "the nodes carry a taint the pods do not tolerate: add it to spec.placement.tolerations",
    ),
    (
        re.compile(r"didn't (match|satisfy) (existing )?pods? (anti-)?affinity"),
        "check spec.placement.affinity and spec.placement.topologyKey",
    ),
    (
        re.compile(r"Insufficient (cpu|memory|ephemeral-storage)"),
        "lower spec.engine.resources.requests, or add nodes with that much free",
    ),
)

# (pattern in a failed pod's "reason: words", what to do), first match wins;
# {node} is its node's name.
_FAILED_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"^Evicted:"),
        "set spec.engine.resources.requests of what the node ran low on to what the "
        "engine uses, so that it is placed where that much is free and evicted last",
    ),
    (
        re.compile(r"Allocate failed|^UnexpectedAdmissionError:"),
        "kubelet on node {node} could not hand out the devices it advertised: check its "
        "device plugin (kubectl describe node {node})",
    ),
)

# A condition as found: (its status, its reason, the message).
Found = tuple[bool, ConditionReason, str]


@dataclass(frozen=True)
class Refusal:
    """A child write the API server refused, as it said; or one shoal did not
    make because the name is someone else's object (`taken`)."""

    child: str  # kind name
    code: int  # HTTP status
    message: str
    taken: bool = False

    @property
    def invalid(self) -> bool:
        """The spec is at fault: a value it passed through was refused, or its
        name makes a child's that another object holds."""
        return self.taken or self.code in (400, 422)

    def __str__(self) -> str:
        return f"{self.child}: {self.message}"


@dataclass(frozen=True)
class StatusInputs:
    name: str
    namespace: str
    generation: int
    spec: VLLMClusterSpec | None
    errors: list[SpecError]
    paused: bool
    observed: Observed
    decision: Decision
    memory: Memory
    probes: Probes
    kv_pools: Mapping[str, KVPool]  # by leader pod uid
    previous: Mapping[str, Any]  # the status as it is now
    now: str  # RFC 3339
    refused: tuple[Refusal, ...] = ()  # this pass's child writes the API server refused
    download: Download | None = None  # the shared model cache's Job, when there is one
    # The replica indices the spec keeps (None: the first spec.replicas).
    live: frozenset[int] | None = None


def build_status(inputs: StatusInputs) -> dict[str, Any]:
    spec, observed = inputs.spec, inputs.observed
    # An invalid spec is not acted on: status describes the replicas that run.
    acted_on = spec if spec is not None and not inputs.errors else None
    nodes = nodes_per_replica(acted_on) if acted_on is not None else _running_nodes(observed)
    wanted = acted_on.replicas if acted_on is not None else len(observed.replicas)
    live = _live(inputs, wanted)
    # A replica the spec no longer keeps is listed while its StatefulSets exist.
    kept = {i for i, r in observed.replicas.items() if i in live or r.sets}
    indices = sorted(kept | live)
    previous_replicas = {
        entry.get("index"): entry for entry in inputs.previous.get("replicaStatuses") or []
    }
    replicas = [
        _replica_status(
            inputs,
            observed.replica(i),
            wanted=wanted,
            nodes=nodes,
            previous=previous_replicas.get(i, {}),
        )
        for i in indices
    ]
    warm = sum(1 for r in replicas if r.index in live and r.state is ReplicaState.SERVING)
    ready = sum(1 for i in sorted(live) if _engine_up(inputs, observed.replica(i), nodes=nodes))
    # A paused cluster's new generation is not acted on yet.
    observed_generation = inputs.generation
    if inputs.paused and inputs.previous.get("observedGeneration") is not None:
        observed_generation = int(inputs.previous["observedGeneration"])
    status = VLLMClusterStatus(
        observed_generation=observed_generation,
        replicas=sum(1 for r in observed.replicas.values() if r.leader is not None),
        ready_replicas=ready,
        warm_replicas=warm,
        selector=leader_selector_text(inputs.name),
        endpoint=_endpoint(inputs),
        conditions=_conditions(inputs, wanted=wanted, warm=warm, replicas=replicas),
        capacity=_capacity(inputs, wanted),
        replica_statuses=replicas,
        model=_model_status(inputs.download),
    )
    return status.to_json()


def _model_status(download: Download | None) -> ModelStatus | None:
    return ModelStatus(download=download_status(download)) if download is not None else None


def _live(inputs: StatusInputs, wanted: int) -> frozenset[int]:
    """The replicas the spec keeps: the reconciler's (`retire.kept_indices`),
    else the first `wanted`."""
    return inputs.live if inputs.live is not None else frozenset(range(wanted))


def _running_nodes(observed: Observed) -> int:
    """Pods per replica of the fleet as it runs (its StatefulSets' groups)."""
    return max((len(r.members) for r in observed.replicas.values()), default=1) or 1


def _endpoint(inputs: StatusInputs) -> str | None:
    if inputs.spec is None:
        return None
    service = f"{router_name(inputs.name)}.{inputs.namespace}.svc"
    return f"http://{service}:{inputs.spec.router.service.port}"


def _engine_up(inputs: StatusInputs, replica: ReplicaFacts, *, nodes: int) -> bool:
    leader = replica.leader_pod
    if leader is None or not group_complete(replica, nodes):
        return False
    if leader.ready or inputs.probes.healthy.get(leader.uid):
        return True
    # Held or draining leaders are out of rotation, their engines still up.
    return leader.warmed is ConditionStatus.FALSE and leader.containers_ready


def _state(inputs: StatusInputs, replica: ReplicaFacts, *, wanted: int, nodes: int) -> ReplicaState:
    index, leader = replica.index, replica.leader_pod
    if index not in _live(inputs, wanted):
        return ReplicaState.DRAINING
    if replica.held:
        return ReplicaState.HELD
    failure = _replica_failure(inputs, replica)
    if failure is not None:
        return failure.state  # CrashLooping, ImagePullFailing, Misconfigured, Unhealthy
    download = inputs.download
    if download is not None and not download.complete and not replica.pods:
        return ReplicaState.DOWNLOADING
    if index in inputs.decision.unhealthy:
        return ReplicaState.UNHEALTHY  # out of rotation for its health, not being restarted now
    terminating = any(p.terminating for p in replica.pods)
    decision = inputs.decision
    if index in decision.restarts or index in decision.replacing or terminating:
        return ReplicaState.RESTARTING
    if index in inputs.memory.in_flight and (leader is None or not leader.ready):
        return ReplicaState.RESTARTING
    if leader is not None and leader.ready and group_complete(replica, nodes):
        return ReplicaState.SERVING
    outcome = inputs.probes.warmups.get(warm_key(leader)) if leader is not None else None
    held = leader is not None and leader.warmed is ConditionStatus.FALSE
    if outcome is not None and outcome.failed and held:
        return ReplicaState.HELD  # its warm-up did not verify and onTimeout is Hold
    if outcome is not None and outcome.running:
        return ReplicaState.WARMING
    if leader is not None and inputs.probes.healthy.get(leader.uid):
        return ReplicaState.WARMING
    return ReplicaState.STARTING


def _replica_status(
    inputs: StatusInputs,
    replica: ReplicaFacts,
    *,
    wanted: int,
    nodes: int,
    previous: Mapping[str, Any],
) -> ReplicaStatus:
    members = replica.members
    restarts = int(previous.get("restarts", 0))
    reason = previous.get("lastRestartReason")
    when = previous.get("lastRestartTime")
    if replica.index in inputs.decision.restarts:
        restarts += 1
        reason = inputs.decision.restarts[replica.index]
        when = inputs.now
    recent = recent_restarts(
        previous.get("recentRestartTimes") or [],
        inputs.now if replica.index in inputs.decision.restarts else None,
        now_wall=wall_seconds(inputs.now) or 0.0,
        window_seconds=(
            float(inputs.spec.health.restart_budget.window_seconds)
            if inputs.spec is not None
            else float("inf")
        ),
    )
    ratio, warmup = previous.get("warmupHitRatio"), previous.get("warmup")
    failure = _replica_failure(inputs, replica)
    leader = replica.leader_pod
    outcome = inputs.probes.warmups.get(warm_key(leader)) if leader is not None else None
    if outcome is not None and not outcome.running:
        ratio = None if outcome.hit_ratio is None else round(outcome.hit_ratio, 3)
        warmup = outcome.message[:2048]
    return ReplicaStatus(
        index=replica.index,
        state=_state(inputs, replica, wanted=wanted, nodes=nodes),
        pods=[p.name for p in members],
        nodes=sorted({p.node for p in members if p.node}),
        gpus=sum(p.gpus for p in members),
        restarts=restarts,
        last_restart_reason=reason,
        last_restart_time=when,
        recent_restart_times=recent,
        container_restarts=sum(c.restarts for p in members for c in p.containers),
        last_termination=last_termination(replica),
        message=failure.message[:REPLICA_MESSAGE_CHARS] if failure is not None else None,
        warmup_hit_ratio=ratio,
        warmup=warmup,
    )


def _capacity(inputs: StatusInputs, wanted: int) -> CapacityStatus | None:
    if inputs.spec is None:
        return None
    plan = plan_spec(inputs.spec)
    if plan is None:
        return None
    measured = []
    for index in sorted(_live(inputs, wanted)):
        leader = inputs.observed.replica(index).leader_pod
        pool = inputs.kv_pools.get(leader.uid) if leader is not None else None
        if pool is not None:
            measured.append(
                MeasuredKV(
                    replica=index,
                    kv_tokens=pool.tokens,
                    block_size=pool.block_size,
                    gpu_blocks=pool.gpu_blocks,
                )
            )
    return CapacityStatus(**dict(plan), measured=measured)


def _conditions(
    inputs: StatusInputs, *, wanted: int, warm: int, replicas: list[ReplicaStatus]
) -> list[Condition]:
    previous = {c.get("type"): c for c in inputs.previous.get("conditions") or []}

    def condition(kind: ConditionType, found: Found) -> Condition:
        ok, reason, message = found
        status = ConditionStatus.of(ok)
        before = previous.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == status else None
        return Condition(
            type=kind,
            status=status,
            observed_generation=inputs.generation,
            last_transition_time=since or inputs.now,
            reason=reason,
            message=message,
        )

    return [
        condition(ConditionType.READY, _ready(inputs, wanted=wanted, warm=warm)),
        condition(ConditionType.AVAILABLE, _available(inputs, wanted=wanted, warm=warm)),
        condition(
            ConditionType.PROGRESSING, _progressing(inputs, wanted=wanted, replicas=replicas)
        ),
        condition(ConditionType.DEGRADED, _degraded(inputs)),
        condition(ConditionType.SPEC_VALID, _spec_valid(inputs)),
    ]


def _none_wanted(inputs: StatusInputs) -> Found:
    """Ready and Available with no replica wanted: spec.replicas is 0, or an
    invalid spec keeps the operator from starting any (wanted counts those
    running then)."""
    if inputs.errors or inputs.spec is None:
        return (
            False,
            ConditionReason.INVALID_SPEC,
            "the spec is invalid (see SpecValid); no replica runs",
        )
    return False, ConditionReason.NO_REPLICAS, "spec.replicas is 0"


def _ready(inputs: StatusInputs, *, wanted: int, warm: int) -> Found:
    if wanted == 0:
        return _none_wanted(inputs)
    if warm < wanted:
        return (
            False,
            ConditionReason.REPLICAS_NOT_WARM,
            f"{warm} of {wanted} replicas are warm and Ready",
        )
    spec, router = inputs.spec, inputs.observed.router
    if spec is not None and spec.router.replicas == 0:
        return (
            False,
            ConditionReason.NO_ROUTER,
            "spec.router.replicas is 0: no router serves the endpoint",
        )
    if spec is not None and (router is None or router.available < 1):
        return False, ConditionReason.ROUTER_UNAVAILABLE, "no router pod is available yet"
    return (
        True,
        ConditionReason.SERVING,
        f"all {wanted} replicas are warm and Ready behind the router",
    )


def _available(inputs: StatusInputs, *, wanted: int, warm: int) -> Found:
    """At least minAvailable replicas (at most spec.replicas) serve behind a router."""
    if wanted == 0:
        return _none_wanted(inputs)
    spec, router = inputs.spec, inputs.observed.router
    needed = min(spec.min_available, wanted) if spec is not None else wanted
    counts = f"{warm} of {wanted} replicas are warm and Ready (at least {needed} needed)"
    if warm < needed:
        return False, ConditionReason.MINIMUM_REPLICAS_UNAVAILABLE, counts
    if spec is not None and spec.router.replicas > 0 and (router is None or router.available < 1):
        return False, ConditionReason.ROUTER_UNAVAILABLE, "no router pod is available yet"
    return True, ConditionReason.MINIMUM_REPLICAS_AVAILABLE, counts


def _progressing(inputs: StatusInputs, *, wanted: int, replicas: list[ReplicaStatus]) -> Found:
    if inputs.paused:
        return (
            False,
            ConditionReason.PAUSED,
            f"reconciling is paused by the {ANNOTATION_PAUSED} annotation",
        )
    if inputs.errors:
        return (
            False,
            ConditionReason.INVALID_SPEC,
            "the spec is invalid (see SpecValid); the fleet is left as is",
        )
    if (download := inputs.download) is not None and download.state in (
        DownloadState.PENDING,
        DownloadState.RUNNING,
    ):
        return (
            True,
            ConditionReason.DOWNLOADING,
            f"the engines wait for the model cache: {download.message}",
        )
    if inputs.refused:
        reason = _refusal_reason(inputs.refused)
        taken = [r for r in inputs.refused if r.taken]
        refused = [r for r in inputs.refused if not r.taken]
        said = [
            f"{what} {_refused_children(these)}"
            for what, these in (
                ("names held by other objects:", taken),
                ("the API server refused", refused),
            )
            if these
        ]
        see = "Degraded" if reason is ConditionReason.RECONCILE_FAILED else "SpecValid"
        return False, reason, f"{'; '.join(said)} (see {see}); what runs is left as is"
    if (stall := inputs.decision.stall) is not None:
        return False, stall.state, stall.message
    states = {r.index: r.state for r in replicas}
    draining = sorted(i for i, s in states.items() if s is ReplicaState.DRAINING)
    live = _live(inputs, wanted)
    missing = [i for i in sorted(live) if inputs.observed.replica(i).leader is None]
    restarting = sorted(i for i, s in states.items() if s is ReplicaState.RESTARTING)
    settled = (ReplicaState.SERVING, ReplicaState.HELD)
    waiting = sorted(i for i, s in states.items() if i in live and s not in settled)
    if draining:
        return True, ConditionReason.SCALING_DOWN, f"draining replicas {_list(draining)}"
    if missing:
        return True, ConditionReason.SCALING_UP, f"creating replicas {_list(missing)}"
    if inputs.decision.replacing or inputs.memory.in_flight:
        busy = sorted(inputs.decision.replacing | set(inputs.memory.in_flight))
        return True, ConditionReason.ROLLING_OUT, f"replacing replicas {_list(busy)}"
    if restarting:
        return True, ConditionReason.RESTARTING, f"restarting replicas {_list(restarting)}"
    if waiting:
        return (
            True,
            ConditionReason.STARTING,
            f"waiting for replicas {_list(waiting)} to become Ready",
        )
    return False, ConditionReason.STABLE, f"all {wanted} replicas are up to date"


def _degraded(inputs: StatusInputs) -> Found:
    if inputs.decision.degraded is not None:
        reason, message = inputs.decision.degraded
        return True, reason, message
    if (download := inputs.download) is not None and download.state is DownloadState.FAILED:
        return True, ConditionReason.DOWNLOAD_FAILED, download.message
    if failed := [r for r in inputs.refused if not r.invalid]:
        return True, ConditionReason.RECONCILE_FAILED, "; ".join(str(r) for r in failed)
    if (router := inputs.observed.router) is not None and router.refused:
        owner = f"Deployment {router_name(inputs.name)}"
        message = refused_pods(owner, router.refused, pod_settings="spec.router.pod")
        return True, ConditionReason.PODS_REFUSED, message
    for replica in sorted(inputs.observed.replicas.values(), key=lambda r: r.index):
        for facts in (replica.leader, replica.worker):
            if facts is not None and facts.refused:
                message = refused_pods(
                    f"StatefulSet {facts.name}", facts.refused, pod_settings="spec.engine.pod"
                )
                return True, ConditionReason.PODS_REFUSED, message
    for replica in sorted(inputs.observed.replicas.values(), key=lambda r: r.index):
        if (failure := _replica_failure(inputs, replica)) is not None:
            said = failure.message[:REPLICA_MESSAGE_CHARS]
            return True, failure.reason, f"replica {replica.index}: {said}"
    return False, ConditionReason.AS_EXPECTED, "no replica is failing"


def _replica_failure(inputs: StatusInputs, replica: ReplicaFacts) -> Failure | None:
    """Why the replica does not run: the first of its pods' failures, leader first."""
    for pod in replica.members:
        if (found := _pod_failure(inputs, pod)) is not None:
            return found
    return None


def _pod_failure(inputs: StatusInputs, pod: PodFacts) -> Failure | None:
    if pod.unschedulable is not None:
        gpu_resource = inputs.spec.gpu.resource if inputs.spec is not None else None
        return Failure(
            ReplicaState.UNHEALTHY,
            ConditionReason.UNSCHEDULABLE,
            _unschedulable(pod, pod.unschedulable, gpu_resource=gpu_resource),
        )
    if pod.failed:
        return Failure(ReplicaState.UNHEALTHY, ConditionReason.POD_FAILED, _failed(pod))
    for container in pod.init_containers:
        # The engine's failures, in the init container's words.
        if (found := container_failure(pod, container)) is not None:
            return replace(found, message=_init_failure(pod, container, reason=found.reason))
    if (found := pod_failure(pod)) is not None:
        return found
    if _stuck(pod, now=wall_seconds(inputs.now)):
        return Failure(
            ReplicaState.UNHEALTHY,
            ConditionReason.POD_STUCK,
            f"pod {pod.name} was scheduled at {pod.scheduled_at} and has created no "
            f"container in {POD_STUCK_SECONDS // 60} minutes: see kubectl describe pod "
            f"{pod.name} (its Events: a volume it cannot mount, or "
            "spec.engine.pod.runtimeClassName without a handler on the node)",
        )
    return None


def _unschedulable(pod: PodFacts, words: str, *, gpu_resource: str | None) -> str:
    fixes = [fix for pattern, fix in _PLACEMENT_HINTS if pattern.search(words)]
    if gpu_resource is not None and f"Insufficient {gpu_resource}" in words:
        gpus = f"{pod.gpus_asked} {gpu_resource}" if pod.gpus_asked else gpu_resource
        fixes.insert(
            0,
            f"it needs {gpus} on one node: free or add GPUs, or lower spec.parallelism.tensor "
            "x spec.parallelism.pipeline (a pod asks for at most spec.gpu.perNode of them)",
        )
    fix = "; ".join(fixes) or f"see kubectl describe pod {pod.name}"
    return f"pod {pod.name} cannot be scheduled: {_quoted(words)}: {fix}"


def _failed(pod: PodFacts) -> str:
    said = f"{pod.reason or 'Failed'}: {pod.message or ''}"
    fix = next(
        (text for pattern, text in _FAILED_HINTS if pattern.search(said)),
        f"see kubectl describe pod {pod.name}",
    )
    why = f" ({_quoted(pod.reason)})" if pod.reason else ""
    words = f": {_quoted(pod.message)}" if pod.message else ""
    return f"pod {pod.name} failed{why}{words}: {fix.format(node=pod.node or '?')}"


def _init_failure(pod: PodFacts, container: ContainerFacts, *, reason: ConditionReason) -> str:
    """An init container's failure, classed as the engine's are
    (failures.container_failure), with its own name, logs and fix."""
    # shoal adds none: a mutating webhook did, whose settings are the fix.
    who = f"init container {container.name} of pod {pod.name} (an admission webhook's)"
    said = (container.waiting_message or "")[:_WORDS_CHARS]
    if reason is ConditionReason.IMAGE_PULL_FAILING:
        return (
            f"{who} cannot pull image {container.image} ({container.waiting}): check the "
            "webhook's image, and the registry's credentials (spec.engine.pod.imagePullSecrets)"
        )
    if reason is ConditionReason.CONTAINER_CONFIG_ERROR:
        said = said or "a Secret or ConfigMap it needs is missing"
        return f"{who} cannot start: {said}: create it, or fix the webhook's reference to it"
    if reason is ConditionReason.CONTAINER_CANNOT_RUN:
        why = last_line(container.exit_message) or said or "no words"
        return f"{who} cannot be started: {why}: see kubectl describe pod {pod.name}"
    restarts = f"{container.restarts} restart{'s' if container.restarts != 1 else ''}"
    if container.exit_reason is ExitReason.OOM_KILLED:
        exited = "was OOMKilled"
    elif container.exit_code is not None:
        exited = f"exits with code {container.exit_code}"
    else:
        exited = "keeps exiting"
    words = last_line(container.exit_message)
    saying = f': saying "{words}"' if words else ""
    logs = f"kubectl logs {pod.name} -c {container.name} --previous"
    return f"{who} {exited} ({restarts}){saying}: see {logs}"


def _quoted(words: str) -> str:
    """Kubelet's or the scheduler's words, cut to leave room for the fix."""
    return words[:_WORDS_CHARS].rstrip(" .") or "(no words)"


def _stuck(pod: PodFacts, *, now: float | None) -> bool:
    """Scheduled more than POD_STUCK_SECONDS ago, and no container created."""
    since = wall_seconds(pod.scheduled_at or "")
    return (
        pod.never_started
        and since is not None
        and now is not None
        and now - since > POD_STUCK_SECONDS
    )


def _spec_valid(inputs: StatusInputs) -> Found:
    if inputs.errors:
        return False, ConditionReason.INVALID_SPEC, "; ".join(str(error) for error in inputs.errors)
    if taken := [r for r in inputs.refused if r.taken]:
        return False, ConditionReason.NAME_TAKEN, "; ".join(str(r) for r in taken)
    if invalid := [r for r in inputs.refused if r.invalid]:
        return False, ConditionReason.CHILD_REFUSED, "; ".join(str(r) for r in invalid)
    return True, ConditionReason.VALID, "the spec is valid"


def _refusal_reason(refused: tuple[Refusal, ...]) -> ConditionReason:
    if any(r.taken for r in refused):
        return ConditionReason.NAME_TAKEN
    if any(r.invalid for r in refused):
        return ConditionReason.CHILD_REFUSED
    return ConditionReason.RECONCILE_FAILED


def _refused_children(refused: Sequence[Refusal]) -> str:
    return ", ".join(dict.fromkeys(r.child for r in refused))


def refusal_event(refused: tuple[Refusal, ...]) -> Event | None:
    """The Warning for this pass's refused child writes (None: none)."""
    if not refused:
        return None
    message = "; ".join(str(r) for r in refused)
    return Event(EventType.WARNING, _refusal_reason(refused), message[:1024])


def _list(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)


def degraded_event(
    previous: Mapping[str, Any], status: Mapping[str, Any], *, told: str | None = None
) -> Event | None:
    """A Warning Event when Degraded turns True or its reason changes, so
    `kubectl describe` tells the story (derived from the two statuses, so a
    pass killed before its status write posts it again). `told`: the reason
    whose Event the decision posts itself (decide's own Degraded), never twice."""

    def degraded(of: Mapping[str, Any]) -> Mapping[str, Any]:
        found = (c for c in of.get("conditions") or [] if c.get("type") == ConditionType.DEGRADED)
        return next(found, {})

    before, now = degraded(previous), degraded(status)
    if now.get("status") != ConditionStatus.TRUE or now.get("reason") == told:
        return None
    if before.get("status") == ConditionStatus.TRUE and before.get("reason") == now.get("reason"):
        return None
    # `status` is this pass's, so its reason is one of ConditionReason's.
    return Event(EventType.WARNING, ConditionReason(now["reason"]), str(now.get("message")))


# Status fields another writer owns (the autoscaler's): never compared, nulled or written here.
FOREIGN_STATUS = frozenset({"autoscaling"})


def status_patch(previous: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch turning previous into status (top-level fields no longer
    set become null), or None when nothing changed."""
    own = {key: value for key, value in previous.items() if key not in FOREIGN_STATUS}
    if own == dict(status):
        return None
    patch: dict[str, Any] = {key: None for key in own if key not in status}
    patch.update(status)
    return patch
