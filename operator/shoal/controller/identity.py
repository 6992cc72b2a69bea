"""Which VLLMCluster an object belongs to, and the metadata that says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.api import API_VERSION, KIND

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
