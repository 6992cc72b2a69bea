"""What the operator keeps while it runs: one API client and one engine
client for the process, the settings, the per-cluster wake-ups (child events
wake the cluster's reconcile loop), and each cluster's small memory."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# kopf's own namespace matching: the operator must agree with its watches.
from kopf._cogs.structs.references import NamespaceName, match_namespace

from shoal.controller.children import ChildStore
from shoal.controller.decide import Event, Memory
from shoal.controller.enginekeys import KeyRing
from shoal.controller.failures import CrashedRun
from shoal.controller.healthloop import HealthChecks
from shoal.controller.identity import ClusterRef, Manifest
from shoal.controller.kube import KubeApi
from shoal.controller.metrics import ClusterKey, OperatorMetrics, PostEvent
from shoal.controller.probes import EngineProbe
from shoal.controller.warming import Warmups
from shoal.engine.client import EngineClient
from shoal.engine.metrics import KVPool

RecordEvent = Callable[[Any, Event], Awaitable[None]]  # posted when it returns


class LiveChildren(Protocol):
    """A cluster's children as the operator's watches last saw them."""

    def get(self, kind: str, name: str) -> Manifest | None: ...


@dataclass(frozen=True)
class ControllerSettings:
    router_image: str
    # Secrets (by name, in each cluster's namespace) the router pods pull with.
    router_pull_secrets: tuple[str, ...] = ()
    # The namespace patterns given to kopf (none: all namespaces).
    namespaces: tuple[str, ...] = ()

    def watches(self, namespace: str) -> bool:
        """Whether the operator watches the namespace, by kopf's own matching
        (globs and `!` exclusions), so that the two never disagree."""
        return not self.namespaces or any(
            match_namespace(NamespaceName(namespace), pattern) for pattern in self.namespaces
        )


class Wakeups:
    """One event per cluster, set by events of its children."""

    def __init__(self) -> None:
        self._events: dict[ClusterKey, asyncio.Event] = {}

    def register(self, key: ClusterKey) -> asyncio.Event:
        event = self._events[key] = asyncio.Event()
        return event

    def poke(self, key: ClusterKey) -> None:
        event = self._events.get(key)
        if event is not None:
            event.set()

    def poke_all(self) -> None:
        for event in self._events.values():
            event.set()

    def poke_namespace(self, namespace: str) -> None:
        for (ns, _), event in self._events.items():
            if ns == namespace:
                event.set()

    def forget(self, key: ClusterKey, event: asyncio.Event) -> None:
        # Only its own: a cluster deleted and made again under the same name
        # may already have registered a new one.
        if self._events.get(key) is event:
            del self._events[key]


@dataclass
class ClusterState:
    """Per-cluster memory, kept in kopf's per-object memo."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    memory: Memory = field(default_factory=Memory)
    restarts_seeded: bool = False  # restart history read back from the status
    kv_pools: dict[str, KVPool] = field(default_factory=dict)  # by leader pod uid
    last_status: dict[str, Any] | None = None
    static_applied: set[str] = field(default_factory=set)  # kind/name made by this process
    # kind/name this process found free or the cluster's own before writing it
    # (reconcile._apply): never someone else's object taken over.
    ours: set[str] = field(default_factory=set)
    drift_reported: dict[str, list[str]] = field(default_factory=dict)  # kind/name -> fields
    last_error: str | None = None  # the spec's errors, last reported
    last_failure: str | None = None  # the last failed pass, last reported
    # The child writes last refused, as reported: kept through passes that end
    # normally (a refusal does), so the same refusal is said once.
    last_refusal: str | None = None
    refused_backoff: float = 5.0  # seconds until a pass with refused writes looks again
    nodes_unreadable: bool = False  # node-loss handling off (said once)
    # The GPU nodes' labels last listed (reconcile.gpu_nodes): kept through a
    # failed list, so the engines' manifests do not change with it.
    gpu_nodes: list[dict[str, Any]] | None = None
    gone: bool = False  # deleted: its daemon has ended (kopf may still run its timer)
    engine_keys: KeyRing = field(default_factory=KeyRing)  # spec.engine.apiKeySecret's, read
    # What the logs of engines' crashed runs said (None: unreadable), so each
    # is read once (controller/crashlogs.py).
    crash_words: dict[CrashedRun, str | None] = field(default_factory=dict)


@dataclass
class OperatorContext:
    settings: ControllerSettings
    post_event: PostEvent
    # What the reconciler awaits before the action an Event announces.
    record_event: RecordEvent
    kube: KubeApi = field(default_factory=KubeApi)
    # One engine client (one connection pool) for every probe, check and warm-up.
    engine: EngineClient = field(default_factory=EngineClient)
    wakeups: Wakeups = field(default_factory=Wakeups)
    children: ChildStore = field(default_factory=ChildStore)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # Namespaces said to be being deleted (a namespace event, a create refused
    # as NamespaceTerminating): their clusters' daemons look, and if so stop
    # reconciling and release their finalizers (controller/finalizer.py).
    going: set[str] = field(default_factory=set)
    crd_going: bool = False  # the VLLMCluster CRD is being deleted (handlers.crd_changed)
    probe: EngineProbe = field(init=False)
    warmups: Warmups = field(init=False)
    health: HealthChecks = field(init=False)

    def __post_init__(self) -> None:
        self.probe = EngineProbe(self.engine)
        self.warmups = Warmups(engine=self.engine)
        self.health = HealthChecks(engine=self.engine)

    def forget(self, ref: ClusterRef, *, deleted: bool) -> None:
        """Stop the background work of a cluster no longer watched; a deleted
        one's children leave the store too (not a paused operator's: its
        passes would read them until their next events)."""
        self.health.forget(ref)
        self.warmups.forget(ref)
        self.metrics.forget((ref.namespace, ref.name))
        if deleted:
            self.children.forget((ref.namespace, ref.name), ref.uid)

    async def close(self) -> None:
        self.warmups.cancel_all()
        await self.health.close()
        await self.kube.close()
        await self.engine.aclose()
