"""The kopf side: handlers, the per-cluster daemon, child-event wake-ups and
kopf's settings. Thin: every handler calls `reconcile`, which does the work.

- create / update / resume: a pass at once (the spec changed, or the
  operator (re)started), with kopf's retries on API errors;
- a daemon per VLLMCluster: a pass whenever a child changes or goes (every
  kind shoal creates is watched, by its cluster label) or a node turns
  NotReady, when a pass asked to look again soon (an engine not yet healthy,
  a drain), and every RESYNC_SECONDS otherwise;
- the watches' events keep the live children other than engines and the
  router's Deployment (Services, ConfigMap, PDB, RBAC) in a store of shoal's
  own (shoal.controller.children: not kopf's indexes, whose start-up hold a
  deleted namespace can leave in place for good);
- a watched namespace, or the CRD, being deleted: the clusters take their
  finalizers off once deleted, which kopf does not (controller/finalizer.py);
- handlers are registered on a registry of their own, not kopf's global one."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import kopf

from shoal.api import API_VERSION, GROUP, KIND, PLURAL, VERSION
from shoal.api.crd import CRD_NAME
from shoal.api.status import ConditionReason, ConditionStatus
from shoal.controller.autoscaler import PERIOD_SECONDS as AUTOSCALE_SECONDS
from shoal.controller.autoscaler import AutoscalerState, autoscale
from shoal.controller.children import STORED_KINDS, cluster_of
from shoal.controller.context import ClusterState, OperatorContext
from shoal.controller.decide import Event, EventType
from shoal.controller.events import NAME_PREFIX, REPORTING_COMPONENT
from shoal.controller.finalizer import namespace_going, release, release_deleted
from shoal.controller.identity import ClusterRef
from shoal.controller.kube import ApiError
from shoal.controller.login import login  # kopf's credentials, as kr8s finds them
from shoal.controller.logs import cluster_logger
from shoal.controller.metrics import ClusterKey
from shoal.controller.names import DOMAIN, FINALIZER, LABEL_CLUSTER
from shoal.controller.reconcile import reconcile

# kopf's own annotations (handler progress, last handled spec).
KOPF_PREFIX = f"operator.{DOMAIN}"

# Level-based safety net: a pass (reads only) this often even without events.
RESYNC_SECONDS = 60.0
# Child events come in bursts (create, schedule, run, ready); one pass after a burst.
DEBOUNCE_SECONDS = 0.1
RETRY_SECONDS = 5.0
# A failed pass is retried after this, doubled at each failure up to the most.
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
# In a namespace being deleted: how often a cluster looks whether it has been deleted.
RELEASE_POLL_SECONDS = 2.0

_TRANSIENT = (ApiError, httpx.HTTPError, TimeoutError, OSError)

# Children whose events wake their cluster: every kind shoal creates.
WATCHED_KINDS = (
    ("v1", "pods"),
    ("apps", "v1", "statefulsets"),
    ("apps", "v1", "deployments"),
    # The model cache's download Job and claim (a completed Job starts the engines).
    ("batch", "v1", "jobs"),
    ("v1", "persistentvolumeclaims"),
    *STORED_KINDS.values(),
)


def context_of(memo: Any) -> OperatorContext:
    ctx: OperatorContext = memo["shoal"]
    return ctx


def state_of(memo: Any) -> ClusterState:
    """The cluster's own memory; kopf's per-object memo outlives handler calls."""
    if "cluster" not in memo:
        memo["cluster"] = ClusterState()
    state: ClusterState = memo["cluster"]
    return state


def key_of(body: kopf.Body) -> ClusterKey:
    return (body.metadata.namespace or "", body.metadata.name or "")


async def reconcile_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    ctx = context_of(memo)
    try:
        await reconcile(ctx, body, state_of(memo), ctx.children.of(key_of(body)))
    except _TRANSIENT as error:
        raise kopf.TemporaryError(str(error), delay=RETRY_SECONDS) from error
    # The daemon follows up (a pass here may have asked to look again soon).
    ctx.wakeups.poke((body.metadata.namespace or "", body.metadata.name or ""))


async def cluster_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    ctx, state = context_of(memo), state_of(memo)
    key = key_of(body)
    live = ctx.children.of(key)
    log = cluster_logger(*key)
    wake = ctx.wakeups.register(key)
    backoff = FIRST_BACKOFF_SECONDS
    released = False
    try:
        while not stopped:
            if key[0] in ctx.going and await _namespace_going(ctx, body):
                log.info("namespace %s is being deleted: reconciling stopped", key[0])
                while not (released := await _deleted_and_released(ctx, body)) and not stopped:
                    await stopped.wait(RELEASE_POLL_SECONDS)
                return
            if ctx.crd_going and (released := await _deleted_and_released(ctx, body)):
                return
            wake.clear()
            started, ok = time.monotonic(), False
            try:
                delay = await reconcile(ctx, body, state, live)
                backoff, state.last_failure, ok = FIRST_BACKOFF_SECONDS, None, True
            except Exception as error:
                # Retried with backoff, the daemon and the cluster's memory
                # kept: what failed may pass next time, and a pass that
                # cannot (a bug) must not stop the others' health checks.
                ok = False
                foreseen = isinstance(error, _TRANSIENT)
                failure = str(error) if foreseen else f"{type(error).__name__}: {error}"
                if foreseen:
                    log.warning("pass failed, retrying in %.0fs: %s", backoff, error)
                else:
                    log.exception("pass failed unexpectedly, retrying in %.0fs", backoff)
                # Refused writes (say, an invalid passed-through field) are the
                # user's to fix, a bug shoal's to report: either is said
                # once, not at every retry.
                if (isinstance(error, ApiError) or not foreseen) and failure != state.last_failure:
                    message = (
                        failure
                        if foreseen
                        else f"internal error ({failure}); the operator's log has its traceback"
                    )
                    ctx.post_event(
                        body, Event(EventType.WARNING, ConditionReason.RECONCILE_FAILED, message)
                    )
                state.last_failure = failure
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                ctx.metrics.pass_finished(key, ok=ok, seconds=time.monotonic() - started)
            try:
                if ctx.crd_going:  # the cluster is deleted soon: look again soon
                    delay = min(delay or RELEASE_POLL_SECONDS, RELEASE_POLL_SECONDS)
                await asyncio.wait_for(wake.wait(), RESYNC_SECONDS if delay is None else delay)
                await asyncio.sleep(DEBOUNCE_SECONDS)
            except TimeoutError:
                pass
    finally:
        ctx.wakeups.forget(key, wake)
        # kopf keeps a daemon's body live: stopped for a deletion, it has the timestamp.
        state.gone = released or body.metadata.deletion_timestamp is not None
        ctx.forget(ClusterRef.of(body), deleted=state.gone)


async def _namespace_going(ctx: OperatorContext, body: kopf.Body) -> bool:
    """Whether the cluster's namespace, said to be going, is: a namespace made
    again under the same name is not (its word is then forgotten)."""
    namespace = body.metadata.namespace or ""
    try:
        going = await namespace_going(ctx.kube, namespace)
    except _TRANSIENT as error:
        cluster_logger(*key_of(body)).warning("cannot read namespace %s: %s", namespace, error)
        return False  # asked again at the next pass
    if not going:
        ctx.going.discard(namespace)
    return going


async def _deleted_and_released(ctx: OperatorContext, body: kopf.Body) -> bool:
    """Whether the cluster has been deleted, its finalizer taken off here if
    kopf no longer watches it (controller/finalizer.py says when)."""
    ref = ClusterRef.of(body)
    log = cluster_logger(ref.namespace, ref.name)
    try:
        found = await ctx.kube.get(API_VERSION, KIND, ref.namespace, ref.name)
        if found is None or found["metadata"].get("uid") != ref.uid:
            return True  # gone: kopf saw it go after all
        if not found["metadata"].get("deletionTimestamp"):
            return False
        if await release(ctx.kube, found):
            log.info("released %s/%s: deleted", ref.namespace, ref.name)
        return True
    except _TRANSIENT as error:
        log.warning("cannot release the cluster yet: %s", error)
        return False


async def autoscale_timer(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The built-in autoscaler's round (spec.autoscaling); returns nothing, so
    kopf stores nothing in status."""
    if state_of(memo).gone:
        return  # kopf keeps calling it once it no longer watches the cluster
    if "autoscaler" not in memo:
        memo["autoscaler"] = AutoscalerState()
    try:
        await autoscale(context_of(memo), body, memo["autoscaler"])
    except _TRANSIENT as error:
        cluster_logger(*key_of(body)).warning("autoscaler round failed: %s", error)


async def child_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Kept (a stored kind), then its cluster woken: the pass sees it."""
    ctx = context_of(memo)
    ctx.children.seen(body, gone=event.get("type") == "DELETED")
    key = cluster_of(body)
    if key is not None:
        ctx.wakeups.poke(key)


async def node_changed(status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
    """A node not Ready: every cluster looks (its pods may need to move once
    the node has been lost for spec.health.nodeLossSeconds)."""
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    if ready and ready[0].get("status") != ConditionStatus.TRUE:
        context_of(memo).wakeups.poke_all()


async def namespace_changed(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A watched namespace being deleted: its clusters' daemons look
    (controller/finalizer.py says why kopf cannot), and those already deleted
    are released at once."""
    ctx = context_of(memo)
    name = body.metadata.name or ""
    if event.get("type") == "DELETED" or body.metadata.deletion_timestamp is None:
        ctx.going.discard(name)
    elif ctx.settings.watches(name):
        ctx.going.add(name)
        ctx.wakeups.poke_namespace(name)
        await _release_deleted(ctx, name)


async def crd_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The VLLMCluster CRD being deleted: kopf stops watching VLLMClusters (a
    resource being deleted cannot be patched), so every cluster's daemon looks
    whether it has been deleted, and releases it."""
    ctx = context_of(memo)
    ctx.crd_going = event.get("type") != "DELETED" and body.metadata.deletion_timestamp is not None
    if ctx.crd_going:
        ctx.wakeups.poke_all()


async def release_going_namespaces(memo: kopf.Memo, **_: Any) -> None:
    """At start-up: kopf does not watch a namespace already being deleted, and
    has no daemon for its clusters; those deleted with it are released here."""
    ctx = context_of(memo)
    try:
        namespaces = await ctx.kube.list("v1", "Namespace", "", "")
    except _TRANSIENT as error:
        logging.getLogger(__name__).warning("cannot list namespaces: %s", error)
        return
    for namespace in namespaces:
        name = namespace["metadata"]["name"]
        if namespace["metadata"].get("deletionTimestamp") and ctx.settings.watches(name):
            await _release_deleted(ctx, name)


async def _release_deleted(ctx: OperatorContext, namespace: str) -> None:
    try:
        for name in await release_deleted(ctx.kube, namespace):
            cluster_logger(namespace, name).info("released %s/%s: deleted", namespace, name)
    except _TRANSIENT as error:
        logging.getLogger(__name__).warning("namespace %s is being deleted: %s", namespace, error)


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await context_of(memo).close()


def build_registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)
    for cause in (kopf.on.create, kopf.on.update, kopf.on.resume):
        cause(*resource, id="reconcile", registry=registry, backoff=RETRY_SECONDS)(
            reconcile_handler
        )
    kopf.daemon(*resource, id="watch", registry=registry, cancellation_timeout=10.0)(cluster_daemon)
    kopf.timer(*resource, id="autoscale", interval=AUTOSCALE_SECONDS, registry=registry)(
        autoscale_timer
    )
    children = {LABEL_CLUSTER: kopf.PRESENT}
    for child in WATCHED_KINDS:
        kopf.on.event(*child, id=f"wake-{child[-1]}", labels=children, registry=registry)(
            child_changed
        )
    kopf.on.event("v1", "nodes", id="wake-nodes", registry=registry)(node_changed)
    kopf.on.event("v1", "namespaces", id="namespaces", registry=registry)(namespace_changed)
    kopf.on.startup(registry=registry)(release_going_namespaces)
    kopf.on.event(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        id="crd",
        field="metadata.name",
        value=CRD_NAME,
        registry=registry,
    )(crd_changed)
    kopf.on.login(registry=registry)(login)
    kopf.on.cleanup(registry=registry)(cleanup)
    return registry


def build_settings(*, standalone: bool) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # Annotations only: status.kopf is not in the CRD's schema and would be
    # pruned, and kopf would retry writing it forever. A prefix of their own:
    # kopf ignores changes to every annotation under its storage prefix, which
    # would hide serving.shoal.dev/paused from the update handler.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    settings.peering.standalone = standalone
    # kopf's own Events (a handler's failures); shoal's are posted by `recorder`.
    settings.posting.reporting_component = REPORTING_COMPONENT
    settings.posting.event_name_prefix = NAME_PREFIX
    # Watch only shoal's children, filtered by the API server, not every pod.
    for child in WATCHED_KINDS:
        settings.watching.label_selectors[child[-1]] = LABEL_CLUSTER
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    return settings
