"""The engines' API key (spec.engine.apiKeySecret) as the operator follows a
rotation. vLLM reads VLLM_API_KEY once, at start: a changed Secret reaches an
engine only when it restarts. So each engine pod template carries the digest
of the key it gets (ANNOTATION_ENGINE_KEY), and a new key is a new template,
rolled out like any other: one replica at a time within
rollout.maxUnavailable, each warm before the next goes. Meanwhile the
routers send each engine the key it took (router/proxy.py), and the
operator's canary sends each pod the key its digest names (KeyRing): an
engine not yet restarted is outdated, not failing.

Pure: the fleet, what is observed and the digest in; the stamped fleet out."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from dataclasses import dataclass, field

from shoal.controller.desired import DesiredFleet, ReplicaObjects, manifest_hash
from shoal.controller.identity import Manifest
from shoal.controller.names import ANNOTATION_ENGINE_KEY
from shoal.controller.observe import Observed

# Keys remembered by digest: the one now and the one before a rotation.
KEPT_KEYS = 2


def key_digest(key: str) -> str:
    """What a pod template records of its key (as a chart's checksum
    annotation of a Secret does): never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class KeyRing:
    """The engine keys this operator read, by digest, the newest last; and
    the first it read (what replicas made before keys were followed are
    taken to hold)."""

    keys: dict[str, str] = field(default_factory=dict)
    first: str | None = None  # a digest

    def remember(self, key: str) -> str:
        digest = key_digest(key)
        if self.first is None:
            self.first = digest
        self.keys.pop(digest, None)
        self.keys[digest] = key
        while len(self.keys) > KEPT_KEYS:
            del self.keys[next(iter(self.keys))]
        return digest

    @property
    def current(self) -> str | None:
        return next(reversed(self.keys.values()), None)

    def keys_for(self, digest: str | None) -> tuple[str, ...]:
        """The keys to try on a pod that records `digest`, its own first, then
        the others newest first: a pod recreated by its old template takes
        the Secret's key now (kubelet reads it at each start), and one from
        before keys were followed records none."""
        own = self.keys.get(digest) if digest is not None else None
        if own is None and digest is None and self.first is not None:
            own = self.keys.get(self.first)
        others = [key for key in reversed(self.keys.values()) if key != own]
        return (own, *others) if own is not None else tuple(others)


def with_engine_key(
    fleet: DesiredFleet, observed: Observed, *, digest: str | None, assumed: str | None
) -> DesiredFleet:
    """The fleet with each replica's engine templates stamped with the key's
    digest. `digest` None (the Secret unreadable now): each keeps the one it
    has, so a failed read rolls nothing. A replica made before keys were
    followed is taken to hold `assumed` (the first key this operator read),
    and keeps its template while that is the key (an operator upgrade rolls
    nothing; the first rotation after it rolls it out)."""
    replicas = []
    for objects in fleet.replicas:
        live = observed.replicas.get(objects.index)
        leader = live.leader if live is not None else None
        if (
            leader is not None
            and leader.engine_key is None
            and leader.spec_hash == manifest_hash(objects.leader)
            and (digest is None or digest == assumed)
        ):
            replicas.append(objects)
            continue
        wanted = digest if digest is not None else (leader.engine_key if leader else None)
        replicas.append(objects if wanted is None else _stamped(objects, wanted))
    return dataclasses.replace(fleet, replicas=replicas)


def _stamped(objects: ReplicaObjects, digest: str) -> ReplicaObjects:
    worker = None if objects.worker is None else _stamp(objects.worker, digest)
    return dataclasses.replace(objects, leader=_stamp(objects.leader, digest), worker=worker)


def _stamp(statefulset: Manifest, digest: str) -> Manifest:
    stamped = copy.deepcopy(statefulset)
    template = stamped["spec"]["template"].setdefault("metadata", {})
    template.setdefault("annotations", {})[ANNOTATION_ENGINE_KEY] = digest
    return stamped
