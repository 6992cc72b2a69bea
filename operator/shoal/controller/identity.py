"""Which VLLMCluster an object belongs to, and the metadata that says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.api import API_VERSION, KIND
from shoal.controller.names import LABEL_CLUSTER

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ClusterRef:
    """A VLLMCluster's identity: what owner references and names need."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, body: Any) -> ClusterRef:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    def owner_reference(self) -> dict[str, Any]:
        """Controller reference: deleting the VLLMCluster deletes the object.
        What kopf.build_owner_reference writes, built by hand: the
        pure builders must not load kopf."""
        return {
            "controller": True,
            "blockOwnerDeletion": True,
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
        }


def object_meta(
    ref: ClusterRef,
    name: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": dict(labels),
        "ownerReferences": [ref.owner_reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def owned_by(obj: Manifest, owner_uid: str) -> bool:
    """Whether obj's controller reference names the cluster with this uid."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(ref, dict) and ref.get("uid") == owner_uid and ref.get("controller")
        for ref in refs
    )


def of_cluster(obj: Manifest, ref: ClusterRef) -> bool:
    """Whether obj is the cluster's own: it has the cluster's controller
    reference, or the cluster's label (shoal made it, perhaps for an earlier
    cluster of that name whose children were kept with --cascade=orphan)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_CLUSTER) == ref.name or owned_by(obj, ref.uid)
