"""Everything a valid VLLMCluster should have running, as manifests. Pure.

`static` objects are the same whatever the replicas do; `replicas` are one
TP group each (a leader StatefulSet and, for multi-node groups, a worker
one). The apply order matters only for a reader of the audit log: what the
router needs before the router, engines before the router's Deployment."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from shoal.api.spec import VLLMClusterSpec
from shoal.controller.engine import build_leader_statefulset, build_worker_statefulset
from shoal.controller.identity import ClusterRef, Manifest
from shoal.controller.router import (
    build_router_configmap,
    build_router_deployment,
    build_router_role,
    build_router_role_binding,
    build_router_service,
    build_router_service_account,
)
from shoal.controller.services import build_engine_pdb, build_engine_service


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


def desired_fleet(ref: ClusterRef, spec: VLLMClusterSpec, *, router_image: str) -> DesiredFleet:
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
        ],
        replicas=[build_replica(ref, spec, index=index) for index in range(spec.replicas)],
        after=[build_router_deployment(ref, spec, image=router_image, configmap=configmap)],
    )


def manifest_hash(manifest: Manifest) -> str:
    """A short, stable digest of a manifest, recorded on the object when applied."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
