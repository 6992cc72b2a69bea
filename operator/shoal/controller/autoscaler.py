"""The built-in autoscaler's I/O, one round per cluster every PERIOD_SECONDS
(a kopf timer, `handlers`): read every router pod's /metrics, sum their
demand, let `autoscale.decide_scale` choose, and set spec.replicas through
the scale subresource under a field manager of its own, as an HPA would.
The rest of the operator then does what any scale does: new replicas are
created and warm-gated before they take traffic, removed ones drained first.

It stands aside while an HPA or a KEDA ScaledObject targets the cluster (two
scalers would fight over spec.replicas), and then, or turned off, takes its
removal order away: the order is for its own scales. It writes
status.autoscaling (desired, current, the signal, the last decision and why)
when the decision changes, and a signal that only moved at most every
STATUS_REFRESH_SECONDS; off, it writes nothing (an idle fleet makes no
writes)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kr8s.asyncio.objects import new_class

from shoal.api import API_VERSION, KIND
from shoal.api.autoscaling import AutoscalingStatus
from shoal.api.router import INTERNAL_PORT
from shoal.api.spec import VLLMClusterSpec
from shoal.controller.autoscale import (
    Demand,
    RouterDemand,
    ScaleDecision,
    ScaleMemory,
    ScalePolicy,
    ScaleReason,
    decide_scale,
    in_flight_by_replica,
    parse_router_demand,
    total_demand,
)
from shoal.controller.context import OperatorContext
from shoal.controller.decide import Event, EventType
from shoal.controller.identity import ClusterRef
from shoal.controller.kube import ApiError
from shoal.controller.logs import cluster_logger
from shoal.controller.names import ANNOTATION_PAUSED, ANNOTATION_REMOVAL_ORDER
from shoal.controller.reconcile import now_text, parse, removal_order_text, router_pods
from shoal.controller.retire import removal_order, replica_loads
from shoal.engine.client import METRICS_DEADLINE_SECONDS
from shoal.engine.endpoints import base_url
from shoal.engine.errors import EngineError

log = logging.getLogger(__name__)

FIELD_MANAGER = "shoal-autoscaler"
# How often each cluster's routers are read: a request held at zero replicas
# waits at most this long before the operator hears of it.
PERIOD_SECONDS = 2.0
STATUS_REFRESH_SECONDS = 15.0
# status.autoscaling's fields, by their names in the CRD.
EVERY_STATUS_FIELD = tuple(AutoscalingStatus().model_dump(by_alias=True))

# KEDA's ScaledObject, beside the kinds kr8s knows (listed only if installed).
SCALED_OBJECT_API = "keda.sh/v1alpha1"
ScaledObject = new_class("ScaledObject", SCALED_OBJECT_API, namespaced=True, plural="scaledobjects")


@dataclass
class AutoscalerState:
    """One cluster's autoscaler memory, kept in kopf's per-object memo."""

    memory: ScaleMemory = field(default_factory=ScaleMemory)
    answered: dict[str, float] = field(default_factory=dict)  # router pod uid -> count
    written: dict[str, Any] | None = None  # status.autoscaling as last written
    written_at: float = 0.0
    # The count last set, and the generation it was set on: the body may lag.
    set_to: tuple[int, int] | None = None
    keda_missing: bool = False  # no ScaledObject kind on this API server


def policy_of(spec: VLLMClusterSpec) -> ScalePolicy:
    scaling = spec.autoscaling
    assert scaling is not None
    return ScalePolicy(
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        target=float(scaling.target(spec.engine.max_num_seqs)),
        tolerance=scaling.tolerance,
        up_window_seconds=float(scaling.scale_up_stabilization_seconds),
        down_window_seconds=float(scaling.scale_down_stabilization_seconds),
        idle_seconds=float(scaling.idle_seconds),
    )


async def autoscale(ctx: OperatorContext, body: Mapping[str, Any], state: AutoscalerState) -> None:
    """One round for one cluster."""
    meta = body["metadata"]
    ref = ClusterRef.of(body)
    status = body.get("status") or {}
    annotations = meta.get("annotations") or {}
    if not (body.get("spec") or {}).get("autoscaling"):
        await _set_removal_order(ctx, ref, None, annotations=annotations)
        if status.get("autoscaling") is not None or state.written is not None:
            await _write(ctx, ref, state, None)
        return
    spec, errors = parse(body)
    paused = annotations.get(ANNOTATION_PAUSED) == "true"
    if spec is None or errors or spec.autoscaling is None or paused:
        # The reconciler reports an invalid spec; a paused cluster is left
        # alone. Its windows are forgotten: the next round is a first round.
        state.memory = ScaleMemory()
        return
    policy = policy_of(spec)
    current = spec.replicas
    generation = int(meta.get("generation", 0))
    if state.set_to is not None and generation <= state.set_to[1]:
        # Our scale is not in this body yet (the watch lags; under load by
        # more than a round): without this the same scale was made again.
        current = state.set_to[0]
    existing = status.get("replicas")
    other = await _other_scaler(ctx, ref, state)
    if other is not None:
        decision = ScaleDecision(
            desired=current,
            reason=ScaleReason.STOOD_ASIDE,
            message=f"{other} scales this cluster: the built-in autoscaler changes nothing",
            recommended=None,
            memory=ScaleMemory(),  # when it is gone, the first round seeds the windows again
        )
        state.memory = decision.memory
        demand = Demand(requests=None, arrived=False)
        routers = 0
        in_flight: dict[str, float] = {}
        await _set_removal_order(ctx, ref, None, annotations=annotations)
    else:
        pods = await router_pods(ctx, ref)
        scrapes = await _read_routers(ctx, {uid: pod.ip for uid, pod in pods.items()})
        routers = sum(1 for found in scrapes.values() if found is not None)
        ready = {uid for uid, pod in pods.items() if pod.ready}
        demand, state.answered = total_demand(scrapes, state.answered, ready=ready)
        in_flight = in_flight_by_replica(scrapes)
        # Stamped when the demand was seen, not when the round began: the
        # down window counts from the last high reading itself.
        decision = decide_scale(
            policy, demand=demand, current=current, memory=state.memory, now=time.monotonic()
        )
        state.memory = decision.memory
    # A process that has not scaled yet keeps the time an earlier one wrote
    # (it starts with nothing written, and its first write nulls what it omits).
    scaled_at = (state.written or status.get("autoscaling") or {}).get("lastScaleTime")
    if decision.desired != current:
        if decision.desired < current:
            # Which replicas go, named before the count drops: the reconciler
            # removes them in this order (controller/retire.py).
            loads = replica_loads(status.get("replicaStatuses") or [], in_flight, cluster=ref.name)
            order = removal_order_text(removal_order(loads), count=decision.desired)
            await _set_removal_order(ctx, ref, order, annotations=annotations)
        await _patch_cluster(ctx, ref, {"spec": {"replicas": decision.desired}}, "scale")
        state.set_to = (decision.desired, generation + 1)
        scaled_at = now_text()
        cluster_logger(ref.namespace, ref.name).info("%s: %s", decision.reason, decision.message)
        ctx.post_event(body, Event(EventType.NORMAL, decision.reason, decision.message))
    elif other is not None and (state.written or {}).get("stoodAsideFor") != other:
        ctx.post_event(body, Event(EventType.NORMAL, decision.reason, decision.message))
    # Through the status model: its field names are the CRD's (others are pruned).
    written = AutoscalingStatus(
        desired_replicas=decision.desired,
        current_replicas=existing if isinstance(existing, int) else current,
        demand=demand.requests,
        target_per_replica=int(policy.target),
        routers=routers,
        last_decision=str(decision.reason),
        message=decision.message,
        last_scale_time=scaled_at,
        stood_aside_for=other,
    ).model_dump(by_alias=True, exclude_none=True)
    await _write(ctx, ref, state, written)


async def _set_removal_order(
    ctx: OperatorContext, ref: ClusterRef, order: str | None, *, annotations: Mapping[str, str]
) -> None:
    """Write the removal order (None: take it away) unless it is so already."""
    if order == annotations.get(ANNOTATION_REMOVAL_ORDER):
        return
    await _patch_cluster(ctx, ref, {"metadata": {"annotations": {ANNOTATION_REMOVAL_ORDER: order}}})


async def _patch_cluster(
    ctx: OperatorContext, ref: ClusterRef, patch: dict[str, Any], subresource: str | None = None
) -> None:
    """A merge patch of the VLLMCluster (or its scale or status), as the autoscaler."""
    await ctx.kube.patch(
        API_VERSION,
        KIND,
        ref.namespace,
        ref.name,
        patch,
        subresource=subresource,
        field_manager=FIELD_MANAGER,
    )


async def _write(
    ctx: OperatorContext,
    ref: ClusterRef,
    state: AutoscalerState,
    autoscaling: dict[str, Any] | None,
) -> None:
    """status.autoscaling (None: removed), when it changed: at once for a new
    decision, at most every STATUS_REFRESH_SECONDS when only the signal moved."""
    before = state.written
    if before is not None and autoscaling is not None:
        moving = ("demand", "message")
        kept = {k: v for k, v in before.items() if k not in moving}
        if kept == {k: v for k, v in autoscaling.items() if k not in moving} and (
            before == autoscaling or time.monotonic() - state.written_at < STATUS_REFRESH_SECONDS
        ):
            return
    await _patch_cluster(
        ctx, ref, {"status": {"autoscaling": status_patch(before, autoscaling)}}, "status"
    )
    state.written, state.written_at = autoscaling, time.monotonic()


def status_patch(
    before: Mapping[str, Any] | None, autoscaling: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The merge patch of status.autoscaling from what this process last
    wrote (None: nothing yet). A merge patch keeps the fields it does not
    name, so those no longer set are nulled; before a first write, every
    field, since a process before this one may have set any (a restarted
    operator left stoodAsideFor for good)."""
    if autoscaling is None:
        return None
    named = before if before is not None else EVERY_STATUS_FIELD
    return {key: None for key in named if key not in autoscaling} | dict(autoscaling)


async def _other_scaler(
    ctx: OperatorContext, ref: ClusterRef, state: AutoscalerState
) -> str | None:
    """The HPA or ScaledObject targeting the cluster, if any (kind/name)."""
    hpas = await ctx.kube.list("autoscaling/v2", "HorizontalPodAutoscaler", ref.namespace, "")
    for hpa in hpas:
        if scales_cluster(hpa, ref):
            return f"HorizontalPodAutoscaler/{hpa['metadata']['name']}"
    if state.keda_missing:
        return None
    try:
        scaled = await ctx.kube.list(SCALED_OBJECT_API, "ScaledObject", ref.namespace, "")
    except ApiError as error:
        if error.status != 404:
            raise
        state.keda_missing = True  # KEDA not installed; its HPA would show above anyway
        return None
    for found in scaled:
        if scales_cluster(found, ref):
            return f"ScaledObject/{found['metadata']['name']}"
    return None


def scales_cluster(scaler: Mapping[str, Any], ref: ClusterRef) -> bool:
    """Whether an HPA or a ScaledObject targets the cluster's scale subresource."""
    target = (scaler.get("spec") or {}).get("scaleTargetRef") or {}
    return bool(target.get("kind") == KIND and target.get("name") == ref.name)


async def _read_routers(
    ctx: OperatorContext, routers: Mapping[str, str]
) -> dict[str, RouterDemand | None]:
    """Each router pod's demand (by uid), None where it did not answer."""
    found = await asyncio.gather(*(_read_router(ctx, ip) for ip in routers.values()))
    return dict(zip(routers, found, strict=True))


async def _read_router(ctx: OperatorContext, ip: str) -> RouterDemand | None:
    try:
        response = await ctx.engine.get(
            base_url(ip, port=INTERNAL_PORT) + "/metrics", deadline=METRICS_DEADLINE_SECONDS
        )
        if response.status != 200:
            return None
        return parse_router_demand(response.text)
    except (EngineError, ValueError):
        return None
