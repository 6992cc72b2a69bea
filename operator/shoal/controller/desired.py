"""Everything a valid VLLMCluster should have running, as manifests. Pure.

`static` objects are the same whatever the replicas do; `replicas` are one
TP group each (a leader StatefulSet and, for multi-node groups, a worker
one). The apply order matters only for a reader of the audit log: what the
router needs before the router, engines before the router's Deployment.

`drift` compares a desired manifest with the live object on the fields the
manifest sets: what `kubectl set image` or `kubectl scale` changed there,
which the recorded hash alone cannot see."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shoal.api.spec import VLLMClusterSpec
from shoal.controller.engine import build_leader_statefulset, build_worker_statefulset
from shoal.controller.identity import ClusterRef, Manifest
from shoal.controller.names import ANNOTATION_SPEC_HASH
from shoal.controller.router import (
    build_router_configmap,
    build_router_deployment,
    build_router_pdb,
    build_router_role,
    build_router_role_binding,
    build_router_service,
    build_router_service_account,
)
from shoal.controller.services import build_engine_pdb, build_engine_service
from shoal.schema.quantity import parse_quantity

# Lists of objects Kubernetes merges by this key (containers, env, ports,
# volumes...): items are matched by it, not by position.
_MERGE_KEYS = ("name", "mountPath", "containerPort", "port")


@dataclass(frozen=True)
class ReplicaObjects:
    index: int
    leader: Manifest
    worker: Manifest | None

    @property
    def manifests(self) -> list[Manifest]:
        return [self.leader] if self.worker is None else [self.leader, self.worker]


@dataclass(frozen=True)
class DesiredFleet:
    before: list[Manifest]  # applied before the engines
    replicas: list[ReplicaObjects]
    after: list[Manifest]  # applied after them (the router's Deployment)

    @property
    def static(self) -> list[Manifest]:
        return self.before + self.after

    def all(self) -> list[Manifest]:
        engines = [m for replica in self.replicas for m in replica.manifests]
        return self.before + engines + self.after


def build_replica(ref: ClusterRef, spec: VLLMClusterSpec, *, index: int) -> ReplicaObjects:
    return ReplicaObjects(
        index=index,
        leader=build_leader_statefulset(ref, spec, index=index),
        worker=build_worker_statefulset(ref, spec, index=index),
    )


def desired_fleet(
    ref: ClusterRef,
    spec: VLLMClusterSpec,
    *,
    router_image: str,
    router_pull_secrets: Sequence[str] = (),
    indices: Sequence[int] | None = None,
) -> DesiredFleet:
    """router_pull_secrets: the Secrets the operator was told pull its own image with;
    indices: the replicas kept (`retire.kept_indices`; None: 0..spec.replicas-1)."""
    configmap = build_router_configmap(ref, spec)
    return DesiredFleet(
        before=[
            build_engine_service(ref),
            build_engine_pdb(ref, spec),
            build_router_service_account(ref),
            build_router_role(ref),
            build_router_role_binding(ref),
            configmap,
            build_router_service(ref, spec),
            build_router_pdb(ref, spec),
        ],
        replicas=[
            build_replica(ref, spec, index=index)
            for index in (range(spec.replicas) if indices is None else indices)
        ],
        after=[
            build_router_deployment(
                ref,
                spec,
                image=router_image,
                configmap=configmap,
                pull_secrets=router_pull_secrets,
            )
        ],
    )


def manifest_hash(manifest: Manifest) -> str:
    """A short, stable digest of a manifest, recorded on the object when applied."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def drifted(manifests: list[Manifest], live: dict[str, Manifest]) -> dict[str, list[str]]:
    """By kind/name, what was changed by hand on the live objects (live, by
    kind/name) whose recorded hash says they are what shoal last wrote; an
    object with another hash is outdated anyway, and a missing one is made."""
    found = {}
    for manifest in manifests:
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        have = live.get(key)
        annotations = (have or {}).get("metadata", {}).get("annotations") or {}
        if have is None or annotations.get(ANNOTATION_SPEC_HASH) != manifest_hash(manifest):
            continue
        if changed := drift(manifest, have):
            found[key] = changed
    return found


def drift(desired: Manifest, live: Manifest) -> list[str]:
    """Paths of fields the desired manifest sets that the live object holds
    differently (or not at all). Fields only the live object has (defaults,
    other writers' own fields) are not drift: shoal's apply would keep them."""
    found: list[str] = []
    # Identity, not content (and listed items carry neither).
    content = {key: value for key, value in desired.items() if key not in ("apiVersion", "kind")}
    _compare(content, live, path="", found=found)
    return found


def _compare(desired: Any, live: Any, *, path: str, found: list[str]) -> None:
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            if desired or live is not None:
                found.append(path or ".")
            return
        for key, value in desired.items():
            _compare(value, live.get(key), path=f"{path}.{key}" if path else key, found=found)
    elif isinstance(desired, list):
        _compare_list(desired, live, path=path, found=found)
    elif desired is not None and not _same_scalar(desired, live):
        found.append(path)


def _compare_list(desired: list[Any], live: Any, *, path: str, found: list[str]) -> None:
    if not isinstance(live, list):
        if desired or live is not None:
            found.append(path)
        return
    key = _merge_key(desired)
    if key is None:
        if len(desired) != len(live):
            found.append(path)
            return
        for position, (want, have) in enumerate(zip(desired, live, strict=True)):
            _compare(want, have, path=f"{path}[{position}]", found=found)
        return
    by_key = {item.get(key): item for item in live if isinstance(item, dict)}
    for item in desired:
        _compare(item, by_key.get(item[key]), path=f"{path}[{item[key]}]", found=found)


def _merge_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in _MERGE_KEYS:
        if all(key in item for item in items):
            return key
    return None


def _same_scalar(desired: Any, live: Any) -> bool:
    if desired == live:
        return True
    if isinstance(desired, bool) or isinstance(live, bool):
        return False
    if not isinstance(desired, int | float | str) or not isinstance(live, int | float | str):
        return False
    # The API server writes quantities back in its own form (4 -> "4", 1000m -> 1).
    try:
        return parse_quantity(str(desired)) == parse_quantity(str(live))
    except ValueError:
        return False
