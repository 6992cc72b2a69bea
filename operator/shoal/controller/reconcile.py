"""One reconciliation pass of one cluster: read, decide, act, report.

The I/O around the pure parts: list the cluster's StatefulSets and pods,
ask engines what decisions need (and read what the background warm-ups and
health loop found), carry out the decision (server-side apply, deletes, pod
conditions), start the warm-ups it asks for, post Events, and write status
when it changed.
Objects whose recorded manifest hash matches are not written, and status is
compared before it is written, so a pass over an idle fleet writes nothing."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shoal.api import API_VERSION, KIND
from shoal.api.cache import DownloadState
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import ConditionReason, ConditionStatus
from shoal.api.validation import SpecError, parse_cluster, validate_spec
from shoal.controller.children import comparable
from shoal.controller.context import ClusterState, LiveChildren, OperatorContext
from shoal.controller.crashlogs import crash_words
from shoal.controller.decide import (
    RESTART_GRACE_SECONDS,
    Decision,
    Desired,
    Event,
    EventReason,
    EventType,
    HealPolicy,
    NotReadyNodes,
    Probes,
    decide,
    health_targets,
    node_not_ready_since,
    out_for_health,
    probe_targets,
)
from shoal.controller.desired import (
    DesiredFleet,
    desired_fleet,
    drift,
    drifted,
    manifest_hash,
)
from shoal.controller.downloads import PROGRESS_SECONDS, prepare_model
from shoal.controller.engine import nodes_per_replica, served_model_name
from shoal.controller.enginekeys import KeyRing, with_engine_key
from shoal.controller.events import children_made
from shoal.controller.failures import crashed_runs, with_last_words
from shoal.controller.healthloop import Target
from shoal.controller.identity import ClusterRef, Manifest, of_cluster
from shoal.controller.kube import NAMESPACE_TERMINATING, ApiError
from shoal.controller.logs import cluster_logger
from shoal.controller.names import (
    ANNOTATION_GROUP,
    ANNOTATION_PAUSED,
    ANNOTATION_REMOVAL_ORDER,
    ANNOTATION_SPEC_HASH,
    CONDITION_WARMED,
    LABEL_CLUSTER,
    engine_selector,
    router_name,
    router_selector,
    selector_text,
)
from shoal.controller.observe import (
    Observed,
    SetFacts,
    is_ready,
    newest_message,
    observe,
    set_facts,
    warm_key,
)
from shoal.controller.placement import GPU_COUNT_LABEL, with_gpu_facts
from shoal.controller.probes import engine_key
from shoal.controller.restarts import seed_restart_times
from shoal.controller.retire import kept_indices, not_serving_first, order_text, parse_order
from shoal.controller.rollout import Marks, RolloutPolicy, held_back, marks_of, spec_text
from shoal.controller.status import (
    Refusal,
    StatusInputs,
    build_status,
    degraded_event,
    refusal_event,
    status_patch,
)
from shoal.controller.warming import warmup_policy

_log = logging.getLogger(__name__)
# A first pass that cannot list nodes yet looks again this soon.
NODES_RETRY_SECONDS = 5.0
# A pass with refused child writes looks again after this, doubling up to the max.
REFUSED_BACKOFF_SECONDS = 5.0
REFUSED_BACKOFF_MAX_SECONDS = 60.0


def heal_policy(spec: VLLMClusterSpec) -> HealPolicy:
    health = spec.health
    return HealPolicy(
        backoff_initial_seconds=float(health.restart_backoff.initial_seconds),
        backoff_max_seconds=float(health.restart_backoff.max_seconds),
        max_restarts=health.restart_budget.max_restarts,
        window_seconds=float(health.restart_budget.window_seconds),
    )


def now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamped(manifest: Manifest, marks: Marks | None = None) -> Manifest:
    """The manifest with its own hash (and a new replica's rollout marks)
    recorded on it."""
    copied = copy.deepcopy(manifest)
    annotations = copied["metadata"].setdefault("annotations", {})
    annotations[ANNOTATION_SPEC_HASH] = manifest_hash(manifest)
    if marks is not None:
        annotations.update({k: v for k, v in marks.annotations().items() if v is not None})
    return copied


def rollout_policy(
    spec: VLLMClusterSpec, observed: Observed, listed: Mapping[str, Manifest]
) -> RolloutPolicy:
    marks = {}
    for index, replica in observed.replicas.items():
        if replica.leader is not None:
            marks[index] = marks_of(listed.get(f"StatefulSet/{replica.leader.name}"))
    return RolloutPolicy(
        spec_text=spec_text(spec),
        deadline_seconds=float(spec.rollout.progress_deadline_seconds),
        now_wall=time.time(),
        marks=marks,
    )


def parse(body: Mapping[str, Any]) -> tuple[VLLMClusterSpec | None, list[SpecError]]:
    # Status and kopf's bookkeeping are not the user's: validate what they wrote.
    manifest = {key: body[key] for key in ("apiVersion", "kind", "metadata", "spec") if key in body}
    cluster, errors = parse_cluster(copy.deepcopy(manifest))
    if cluster is None:
        return None, errors
    return cluster.spec, validate_spec(cluster.spec)


async def reconcile(
    ctx: OperatorContext, body: Mapping[str, Any], state: ClusterState, live: LiveChildren
) -> float | None:
    """One pass; returns how soon to look again (None: on the next event).
    live: the cluster's children other than engines and the router's
    Deployment, as the watches see them."""
    async with state.lock:
        return await _reconcile(ctx, body, state, live)


async def _reconcile(
    ctx: OperatorContext, body: Mapping[str, Any], state: ClusterState, live: LiveChildren
) -> float | None:
    ref = ClusterRef.of(body)
    log = cluster_logger(ref.namespace, ref.name)
    meta = body["metadata"]
    paused = (meta.get("annotations") or {}).get(ANNOTATION_PAUSED) == "true"
    spec, errors = parse(body)
    valid = spec is not None and not errors
    if valid and spec is not None:
        gpus = await gpu_nodes(ctx, state)
        if gpus is None:
            log.warning("cannot list nodes yet (their GPU facts shape the engines): trying again")
            return NODES_RETRY_SECONDS
        spec = with_gpu_facts(spec, gpus)
    observed, listed = await _observe(ctx, ref, spec)
    state.crash_words = await crash_words(
        ctx.kube, ref, crashed_runs(observed), known=state.crash_words
    )
    observed = with_last_words(observed, state.crash_words)
    fleet = None
    desired = None
    kept: list[int] | None = None
    changed: dict[str, list[str]] = {}
    if valid:
        assert spec is not None
        policy = rollout_policy(spec, observed, listed)
        kept = live_indices(spec, observed, meta.get("annotations") or {})
        fleet, fallback = held_back(
            ref,
            desired_fleet(
                ref,
                spec,
                router_image=ctx.settings.router_image,
                router_pull_secrets=ctx.settings.router_pull_secrets,
                indices=kept,
            ),
            policy=policy,
        )
        if spec.engine.api_key_secret is not None:
            key = await engine_key(ctx.kube, namespace=ref.namespace, spec=spec)
            keys = state.engine_keys
            digest = keys.remember(key) if key is not None else None
            fleet = with_engine_key(fleet, observed, digest=digest, assumed=keys.first)
        if not paused:
            changed = drifted(fleet.all(), listed)
            await _report_drift(ctx, body, ref, state, changed)
            observed = _drifted_as_outdated(observed, changed)
        desired = Desired(
            replicas={replica.index: replica for replica in fleet.replicas},
            nodes=nodes_per_replica(spec),
            max_unavailable=spec.rollout.max_unavailable,
            # A request the router still waits for ends by the router's total deadline.
            drain_deadline_seconds=float(spec.router.timeouts.total_seconds),
            warmup_enabled=spec.warmup.enabled,
            warmup=warmup_policy(spec),
            heal=heal_policy(spec),
            node_loss_seconds=float(spec.health.node_loss_seconds),
            rollout=policy,
            fallback=fallback,
        )
    refused: list[Refusal] = []
    download = None
    if valid and not paused:
        assert spec is not None
        download = await prepare_model(
            ctx.kube,
            ref,
            spec,
            image=ctx.settings.router_image,
            pull_secrets=ctx.settings.router_pull_secrets,
            apply=lambda manifest: _apply(ctx, ref, state, manifest, refused),
            engine=ctx.engine,
        )
        if download is not None and not download.complete:
            desired = None  # engines start, or roll, only once their model is there
    if not state.restarts_seeded:
        # A new operator process: count the restarts an earlier one made.
        state.restarts_seeded = True
        seeded = seed_restart_times(
            body.get("status") or {}, now_wall=time.time(), now_mono=time.monotonic()
        )
        if seeded and not state.memory.restart_times:
            state.memory = dataclasses.replace(state.memory, restart_times=seeded)
        # And the replicas it took out for their health, from their gates:
        # else a hung one (its /health answers) is admitted again as new.
        if not state.memory.sick:
            state.memory = dataclasses.replace(state.memory, sick=out_for_health(observed))
    if paused:
        decision, probes = Decision(memory=state.memory), Probes()
    else:
        probes = await _probe(ctx, ref, state, observed, spec if valid else None, kept=kept)
        nodes = None
        if desired is not None:
            lost = await _nodes_not_ready(ctx, state, observed)
            nodes = NotReadyNodes(since=lost, now=time.time())
        decision = decide(
            desired=desired,
            observed=observed,
            probes=probes,
            memory=state.memory,
            now=time.monotonic(),
            nodes=nodes,
        )
        await _act(ctx, body, ref, state, decision, fleet, observed, live, changed, refused)
        if valid and spec is not None:
            for pod in decision.warm:
                ctx.warmups.start(
                    ctx.kube, ref, spec, pod, lambda: ctx.wakeups.poke((ref.namespace, ref.name))
                )
    state.memory = decision.memory
    await _report_spec(ctx, body, state, errors)
    # Our last write is fresher than the body while the watch catches up.
    previous = state.last_status if state.last_status is not None else body.get("status") or {}
    status = build_status(
        StatusInputs(
            name=ref.name,
            namespace=ref.namespace,
            generation=int(meta.get("generation", 0)),
            spec=spec,
            errors=errors,
            paused=paused,
            observed=observed,
            decision=decision,
            memory=state.memory,
            probes=probes,
            kv_pools=state.kv_pools,
            previous=previous,
            now=now_text(),
            refused=tuple(refused),
            download=download,
            live=frozenset(kept) if kept is not None else None,
        )
    )
    told = decision.degraded[0] if decision.degraded is not None else None
    if (event := degraded_event(previous, status, told=told)) is not None:
        # Before the status write it is derived from, so a killed pass posts it again.
        log.warning("%s: %s", event.reason, event.message)
        await ctx.record_event(body, event)
    await _report_refusals(ctx, body, state, tuple(refused))
    await _write_status(ctx, ref, state, previous, status)
    replicas = spec.replicas if spec is not None else int(status.get("replicas") or 0)
    ctx.metrics.observe_cluster((ref.namespace, ref.name), desired=replicas, status=status)
    requeue = decision.requeue_seconds
    if download is not None and download.state is DownloadState.RUNNING:
        # Its progress makes no event: look again to follow it in status.
        requeue = min(requeue or PROGRESS_SECONDS, PROGRESS_SECONDS)
    if refused:
        # Refused writes are the user's to fix; look again, less and less often.
        requeue = min(requeue or state.refused_backoff, state.refused_backoff)
        state.refused_backoff = min(state.refused_backoff * 2, REFUSED_BACKOFF_MAX_SECONDS)
    else:
        state.refused_backoff = REFUSED_BACKOFF_SECONDS
    if requeue is not None:
        log.debug("looking again in %.1fs", requeue)
    return requeue


async def _observe(
    ctx: OperatorContext, ref: ClusterRef, spec: VLLMClusterSpec | None
) -> tuple[Observed, dict[str, Manifest]]:
    """The facts, and the listed StatefulSets and router Deployment by kind/name."""
    selector = selector_text(engine_selector(ref.name))
    statefulsets, pods, router = await asyncio.gather(
        ctx.kube.list("apps/v1", "StatefulSet", ref.namespace, selector),
        ctx.kube.list("v1", "Pod", ref.namespace, selector),
        ctx.kube.get("apps/v1", "Deployment", ref.namespace, router_name(ref.name)),
    )
    gpu_resource = spec.gpu.resource if spec is not None else "nvidia.com/gpu"
    observed = observe(
        statefulsets=statefulsets,
        pods=pods,
        router=router,
        gpu_resource=gpu_resource,
        owner_uid=ref.uid,
        refusals=await _pod_refusals(ctx, ref, statefulsets),
    )
    # Listed items carry no kind of their own.
    listed = {f"StatefulSet/{o['metadata']['name']}": o for o in statefulsets}
    if router is not None:
        listed[f"Deployment/{router['metadata']['name']}"] = router
    return observed, listed


# A FailedCreate Event older than this is about trouble since mended; the
# StatefulSet controller retries a refused create (and says so again) within it.
REFUSAL_SECONDS = 20 * 60


async def _pod_refusals(
    ctx: OperatorContext, ref: ClusterRef, statefulsets: list[Manifest]
) -> dict[str, str]:
    """Why the API server refuses the pods of a StatefulSet that has fewer
    than it asks for (Pod Security, a quota, a webhook): the controller says
    so only in Events. Read only for such a set, so a healthy fleet reads none."""
    found: dict[str, str] = {}
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - REFUSAL_SECONDS))
    for statefulset in statefulsets:
        facts = set_facts(statefulset, owner_uid=ref.uid)
        if facts is None or not facts.missing_pods:
            continue
        fields = (
            f"involvedObject.kind=StatefulSet,involvedObject.name={facts.name},reason=FailedCreate"
        )
        events = await ctx.kube.list("v1", "Event", ref.namespace, "", fields=fields)
        if (message := newest_message(events, since=since)) is not None:
            found[facts.name] = message
    return found


# The removal order names the count the autoscaler set with it, as one more
# comma-separated part (which parse_order skips): a ranking left from its own
# last scale-down is no ranking for a scale an HPA, KEDA or `kubectl scale`
# makes later, which sees other replicas ready than it did.
_ORDER_COUNT = "replicas="


def removal_order_text(order: Sequence[int], *, count: int) -> str:
    """The removal-order annotation for a scale to count, first removed first."""
    return f"{_ORDER_COUNT}{count},{order_text(order)}"


def removal_order_for(text: str | None, *, count: int) -> tuple[int, ...]:
    """The annotation's indices if it was written for a scale to count, else
    none (one with no count, an earlier operator's, says for no scale)."""
    parts = {part.strip() for part in (text or "").split(",")}
    return parse_order(text) if f"{_ORDER_COUNT}{count}" in parts else ()


def live_indices(
    spec: VLLMClusterSpec, observed: Observed, annotations: Mapping[str, str]
) -> list[int]:
    """The replicas the spec keeps: those that exist, less the first of the
    autoscaler's removal order (only while it scales the cluster: written for
    the count spec.replicas has), then those not serving (a scale-down by
    hand must not drain the serving replicas while one that loads stays), or
    more."""
    text = annotations.get(ANNOTATION_REMOVAL_ORDER) if spec.autoscaling is not None else None
    existing = [i for i, replica in observed.replicas.items() if replica.leader is not None]
    idle = not_serving_first(
        {i: (p := observed.replica(i).leader_pod) is not None and p.ready for i in existing}
    )
    order = (*removal_order_for(text, count=spec.replicas), *idle)
    return kept_indices(count=spec.replicas, existing=existing, order=order)


def _drifted_as_outdated(observed: Observed, changed: dict[str, list[str]]) -> Observed:
    """A StatefulSet changed by hand no longer is what its recorded hash says:
    without the hash it is outdated, and the rollout (warm-gated, within
    maxUnavailable) applies the spec's again; pods already made from the
    changed template are replaced as any outdated pod is."""
    if not changed:
        return observed

    def kept(facts: SetFacts | None) -> SetFacts | None:
        if facts is not None and f"StatefulSet/{facts.name}" in changed:
            return dataclasses.replace(facts, spec_hash=None)
        return facts

    replicas = {
        index: dataclasses.replace(
            replica, leader=kept(replica.leader), worker=kept(replica.worker)
        )
        for index, replica in observed.replicas.items()
    }
    return dataclasses.replace(observed, replicas=replicas)


async def _report_drift(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    ref: ClusterRef,
    state: ClusterState,
    changed: dict[str, list[str]],
) -> None:
    """An Event per object changed by hand, once per change (a revert may wait
    for the rollout's budget)."""
    for key, fields in changed.items():
        if state.drift_reported.get(key) != fields:
            await _announce(ctx, body, ref, _drift_event(key, fields))
    state.drift_reported = dict(changed)


async def _probe(
    ctx: OperatorContext,
    ref: ClusterRef,
    state: ClusterState,
    observed: Observed,
    spec: VLLMClusterSpec | None,
    *,
    kept: list[int] | None,
) -> Probes:
    wanted = set(kept) if kept is not None else set(observed.replicas)
    nodes = nodes_per_replica(spec) if spec is not None else None
    health, metrics = probe_targets(
        observed, wanted=wanted, nodes=nodes, kv_known=set(state.kv_pools)
    )
    healthy_answers = await asyncio.gather(*(ctx.probe.healthy(pod.ip or "") for pod in health))
    metrics_answers = await asyncio.gather(*(ctx.probe.metrics(pod.ip or "") for pod in metrics))
    healthy = {pod.uid: answer for pod, answer in zip(health, healthy_answers, strict=True)}
    scraped = {pod.uid: answer for pod, answer in zip(metrics, metrics_answers, strict=True)}
    live = {p.uid for r in observed.replicas.values() for p in r.pods}
    state.kv_pools = {uid: pool for uid, pool in state.kv_pools.items() if uid in live}
    for uid, found in scraped.items():
        if found is not None and found.kv_pool is not None:
            state.kv_pools[uid] = found.kv_pool
    assessed = {}
    if spec is not None:
        assert nodes is not None
        keys = state.engine_keys if spec.engine.api_key_secret is not None else KeyRing()
        targets = {
            pod.uid: Target(
                pod.ip or "",
                served_model_name(spec),
                pod.name,
                keys=keys.keys_for(pod.engine_key) or (None,),
            )
            for pod in health_targets(observed, wanted=wanted, nodes=nodes, sick=state.memory.sick)
            if pod.ip
        }
        routers = (
            {uid: pod.ip for uid, pod in (await router_pods(ctx, ref)).items()}
            if targets and spec.health.router_errors.enabled
            else {}
        )
        assessed = ctx.health.update(
            ref,
            spec.health,
            targets,
            lambda: ctx.wakeups.poke((ref.namespace, ref.name)),
            routers=routers,
        )
    return Probes(
        healthy=healthy,
        metrics=scraped,
        warmups=ctx.warmups.outcomes(
            ref, {warm_key(p) for r in observed.replicas.values() for p in r.pods}
        ),
        health=assessed,
    )


@dataclasses.dataclass(frozen=True)
class RouterPod:
    ip: str
    ready: bool  # the router Service sends it new requests


async def router_pods(ctx: OperatorContext, ref: ClusterRef) -> dict[str, RouterPod]:
    """The cluster's running router pods (by uid), whose /metrics the health
    loop (each replica's errors) and the autoscaler (demand) read; none when
    they cannot be listed."""
    try:
        pods = await ctx.kube.list(
            "v1", "Pod", ref.namespace, selector_text(router_selector(ref.name))
        )
    except ApiError:
        return {}
    found = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if ip and status.get("phase") == "Running" and not meta.get("deletionTimestamp"):
            found[str(meta.get("uid"))] = RouterPod(str(ip), is_ready(pod))
    return found


async def gpu_nodes(ctx: OperatorContext, state: ClusterState) -> list[Manifest] | None:
    """The labels of the nodes GFD labelled (their GPUs' count and memory).
    When the API server fails to list them (a 429, a 5xx), the last ones
    read: the facts shape every engine manifest, so facts that came and went
    would replace replicas (None: none read yet). When the operator may not
    read nodes, none: the spec's gpu fields then stand."""
    try:
        nodes = await ctx.kube.list_nodes()
    except ApiError as error:
        if error.status in (401, 403, 404):
            return []
        return state.gpu_nodes
    labelled = ((n.get("metadata") or {}).get("labels") or {} for n in nodes)
    state.gpu_nodes = [{"metadata": {"labels": dict(x)}} for x in labelled if GPU_COUNT_LABEL in x]
    return state.gpu_nodes


async def _nodes_not_ready(
    ctx: OperatorContext, state: ClusterState, observed: Observed
) -> dict[str, float]:
    """NotReady nodes holding the cluster's pods; none if nodes cannot be read
    (say, RBAC without nodes: node-loss handling is then off, said once)."""
    used = {p.node for r in observed.replicas.values() for p in r.pods if p.node}
    if not used:
        return {}
    try:
        nodes = await ctx.kube.list_nodes()
    except ApiError as error:
        if not state.nodes_unreadable:
            _log.warning("cannot read nodes, node-loss handling is off: %s", error)
        state.nodes_unreadable = True
        return {}
    state.nodes_unreadable = False
    lost = node_not_ready_since(nodes)
    return {name: since for name, since in lost.items() if name in used}


async def _apply(
    ctx: OperatorContext,
    ref: ClusterRef,
    state: ClusterState,
    manifest: Manifest,
    refused: list[Refusal],
    *,
    marks: Marks | None = None,
) -> bool:
    """Apply; a refusal is noted in refused (the pass goes on with the other
    children, and status and an Event say what was refused), not raised.
    marks: a new leader StatefulSet's rollout marks.

    The apply is forced (drift is put back), so before this process first
    writes a name, it reads the object there: one that is not the cluster's
    (a user's own `<cluster>-router` Service, say) is left alone and refused
    as taken, not taken over, nor later deleted with the cluster."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    log = cluster_logger(ref.namespace, ref.name)
    key = f"{kind}/{name}"
    try:
        if key not in state.ours:
            live = await ctx.kube.get(manifest["apiVersion"], kind, ref.namespace, name)
            if live is not None and not of_cluster(live, ref):
                why = (
                    f"exists and is not this VLLMCluster's (no {LABEL_CLUSTER}={ref.name} label, "
                    "no owner reference to it), so shoal leaves it alone: rename the "
                    f"VLLMCluster, or rename or delete that {kind}"
                )
                refused.append(Refusal(f"{kind} {name}", 409, why, taken=True))
                log.warning("%s %s is not this cluster's: left alone", kind, name)
                return False
        await ctx.kube.apply(stamped(manifest, marks))
    except ApiError as error:
        if NAMESPACE_TERMINATING in error.causes:
            ctx.going.add(ref.namespace)  # the daemon's next look stops the passes
        refused.append(Refusal(f"{kind} {name}", error.status, error.message))
        log.warning("the API server refused %s %s: %s", kind, name, error)
        return False
    state.ours.add(key)
    log.info("applied %s %s", kind, name)
    return True


async def _apply_static(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    ref: ClusterRef,
    state: ClusterState,
    manifests: list[Manifest],
    live: LiveChildren,
    refused: list[Refusal],
) -> None:
    """Apply what is missing, outdated or changed by hand, compared with the
    live objects the watches keep (no GET: an idle fleet reads nothing)."""
    made_before = children_made(body.get("status") or {})
    for manifest in manifests:
        meta = manifest["metadata"]
        key = f"{manifest['kind']}/{meta['name']}"
        found = live.get(manifest["kind"], meta["name"])
        made = key in state.static_applied or made_before
        if found is None and made:
            # Made by this process or one before it: read it, as the watches
            # may not have delivered it yet (a pass right after a start).
            read = await ctx.kube.get(
                manifest["apiVersion"], manifest["kind"], ref.namespace, meta["name"]
            )
            found = None if read is None else comparable(read)
        event = None
        if found is None:
            if made:
                event = Event(
                    EventType.WARNING,
                    EventReason.CHILD_RESTORED,
                    f"{key} was deleted; making it again",
                )
        elif _recorded_hash(found) != manifest_hash(manifest):
            pass  # the spec changed: a plain update
        elif changed := drift(manifest, found):
            event = _drift_event(key, changed)
        else:
            continue
        if event is not None:
            await _announce(ctx, body, ref, event)
        if not await _apply(ctx, ref, state, manifest, refused):
            continue
        state.static_applied.add(key)


def _recorded_hash(live: Manifest) -> str | None:
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    found = annotations.get(ANNOTATION_SPEC_HASH)
    return None if found is None else str(found)


def _drift_event(key: str, changed: list[str]) -> Event:
    fields = ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
    return Event(
        EventType.WARNING,
        EventReason.DRIFT_REVERTED,
        f"{key} was changed outside shoal ({fields}); restoring what the spec says",
    )


async def _announce(
    ctx: OperatorContext, body: Mapping[str, Any], ref: ClusterRef, event: Event
) -> None:
    """Log and post an Event, before the action it announces (see `events`)."""
    level = logging.WARNING if event.type is EventType.WARNING else logging.INFO
    logger = cluster_logger(ref.namespace, ref.name, replica=event.replica, pod=event.pod)
    logger.log(level, "%s: %s", event.reason, event.message)
    await ctx.record_event(body, event)


async def _act(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    ref: ClusterRef,
    state: ClusterState,
    decision: Decision,
    fleet: DesiredFleet | None,
    observed: Observed,
    live: LiveChildren,
    changed: dict[str, list[str]],
    refused: list[Refusal],
) -> None:
    # Told before done: a pass killed after acting has posted its story already.
    for event in decision.events:
        await _announce(ctx, body, ref, event)
    if fleet is not None:
        await _apply_static(ctx, body, ref, state, fleet.before, live, refused)
    sets = {s.name for r in observed.replicas.values() for s in r.sets}
    marked = set()
    for manifest in decision.apply:
        name = manifest["metadata"]["name"]
        marks = decision.marks.get(name) if manifest["kind"] == "StatefulSet" else None
        if marks is not None and name in sets:
            # Before the template: a pass killed between the two still knows
            # when the replica was replaced and what to go back to.
            marked.add(name)
            if not await _mark(ctx, ref, name, marks, refused):
                continue
        await _apply(ctx, ref, state, manifest, refused, marks=marks if name not in sets else None)
        if marks is not None:
            marked.add(name)
    for name, marks in decision.marks.items():
        if name not in marked and name in sets:
            await _mark(ctx, ref, name, marks, refused)
    if fleet is not None:
        for manifest in fleet.after:
            router = observed.router
            key = f"{manifest['kind']}/{manifest['metadata']['name']}"
            if router is None or router.spec_hash != manifest_hash(manifest) or key in changed:
                await _apply(ctx, ref, state, manifest, refused)
    # Out of rotation first (a restart stops traffic before its pods go).
    for gate in decision.gates:
        condition = {
            "type": CONDITION_WARMED,
            "status": str(ConditionStatus.of(gate.status)),
            "reason": str(gate.reason),
            "message": gate.message,
            "lastTransitionTime": now_text(),
        }
        await ctx.kube.patch(
            "v1",
            "Pod",
            ref.namespace,
            gate.pod.name,
            {"status": {"conditions": [condition]}},
            subresource="status",
            patch_type="strategic-merge",
        )
        cluster_logger(ref.namespace, ref.name, replica=gate.pod.replica, pod=gate.pod.name).info(
            "set %s=%s (%s)", CONDITION_WARMED, condition["status"], gate.reason
        )
    for statefulset in decision.delete_sets:
        await ctx.kube.delete(
            "apps/v1", "StatefulSet", ref.namespace, statefulset.name, uid=statefulset.uid
        )
        cluster_logger(ref.namespace, ref.name, replica=statefulset.replica).info(
            "deleted StatefulSet %s", statefulset.name
        )
    for pod in decision.force_delete:
        await ctx.kube.delete("v1", "Pod", ref.namespace, pod.name, uid=pod.uid, grace_seconds=0)
        cluster_logger(ref.namespace, ref.name, replica=pod.replica, pod=pod.name).warning(
            "force-deleted pod on lost node %s", pod.node
        )
    for pod in decision.delete_pods:
        # A restart: the replica is broken or unhealthy, so what it runs
        # cannot drain (a hung engine would hold its whole shutdownTimeout).
        await ctx.kube.delete(
            "v1", "Pod", ref.namespace, pod.name, uid=pod.uid, grace_seconds=RESTART_GRACE_SECONDS
        )
        cluster_logger(ref.namespace, ref.name, replica=pod.replica, pod=pod.name).info(
            "deleted pod"
        )
    for pod in decision.replace_pods:
        await ctx.kube.delete("v1", "Pod", ref.namespace, pod.name, uid=pod.uid)
        cluster_logger(ref.namespace, ref.name, replica=pod.replica, pod=pod.name).info(
            "deleted outdated pod; it drains within its grace period"
        )
    for pod, token in decision.stamps:
        await ctx.kube.patch(
            "v1",
            "Pod",
            ref.namespace,
            pod.name,
            {"metadata": {"annotations": {ANNOTATION_GROUP: token}}},
        )


async def _mark(
    ctx: OperatorContext, ref: ClusterRef, name: str, marks: Marks, refused: list[Refusal]
) -> bool:
    """Write a leader StatefulSet's rollout marks (a merge patch: None removes)."""
    try:
        await ctx.kube.patch(
            "apps/v1",
            "StatefulSet",
            ref.namespace,
            name,
            {"metadata": {"annotations": marks.annotations()}},
        )
    except ApiError as error:
        refused.append(Refusal(f"StatefulSet {name}", error.status, error.message))
        return False
    return True


async def _report_refusals(
    ctx: OperatorContext, body: Mapping[str, Any], state: ClusterState, refused: tuple[Refusal, ...]
) -> None:
    """A Warning Event when child writes are refused (once per distinct refusal)."""
    event = refusal_event(refused)
    message = event.message if event is not None else None
    if event is not None and message != state.last_refusal:
        meta = body["metadata"]
        cluster_logger(meta["namespace"], meta["name"]).warning("%s: %s", event.reason, message)
        await ctx.record_event(body, event)
    state.last_refusal = message


async def _report_spec(
    ctx: OperatorContext, body: Mapping[str, Any], state: ClusterState, errors: list[SpecError]
) -> None:
    """An Event when the spec turns invalid (or its errors change)."""
    message = "; ".join(str(error) for error in errors) or None
    if message is not None and message != state.last_error:
        event = Event(
            EventType.WARNING, ConditionReason.INVALID_SPEC, f"{message}; nothing was changed"
        )
        meta = body["metadata"]
        cluster_logger(meta["namespace"], meta["name"]).warning("InvalidSpec: %s", message)
        await ctx.record_event(body, event)
    state.last_error = message


async def _write_status(
    ctx: OperatorContext,
    ref: ClusterRef,
    state: ClusterState,
    previous: Mapping[str, Any],
    status: dict[str, Any],
) -> None:
    patch = status_patch(previous, status)
    if patch is not None:
        await ctx.kube.patch(
            API_VERSION, KIND, ref.namespace, ref.name, {"status": patch}, subresource="status"
        )
    state.last_status = status
