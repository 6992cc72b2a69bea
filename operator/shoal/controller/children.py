"""The children a pass applies whole and compares (Services, the router's
ConfigMap, PodDisruptionBudgets, RBAC), as the operator's watches last
delivered them, by cluster: an idle fleet's pass reads none of them, and one
deleted by hand is made again at once.

Not kopf's indexes. kopf (1.45) holds every handler until each indexed kind
has been listed in each watched namespace, and when a namespace matching a
`--namespace` glob goes while one of those lists is in flight, its watcher
stops without lifting the hold: from then on the operator reconciles
nothing, in any namespace. The fault suite hit it when a finished test's
namespace went as the operator started. This store holds nothing back, so
a pass may come before the watches have delivered a child: one the
operator made before is then read, so that it is not taken for deleted
(reconcile._apply_static)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.controller.identity import Manifest, owned_by
from shoal.controller.metrics import ClusterKey
from shoal.controller.names import LABEL_CLUSTER

# Kinds kept here: the ones a pass compares field by field. Engines'
# StatefulSets and pods and the router's Deployment are listed by each pass.
STORED_KINDS: dict[str, tuple[str, ...]] = {
    "Service": ("v1", "services"),
    "ConfigMap": ("v1", "configmaps"),
    "ServiceAccount": ("v1", "serviceaccounts"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
}


def comparable(body: Mapping[str, Any]) -> Manifest:
    """A child as a pass compares it: status and managed fields left out."""
    kept = {key: copy.deepcopy(value) for key, value in body.items() if key != "status"}
    meta = kept.get("metadata") or {}
    kept["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return kept


def cluster_of(body: Mapping[str, Any]) -> ClusterKey | None:
    """The cluster a child belongs to, by its label; None for an object without."""
    meta = body.get("metadata") or {}
    cluster = (meta.get("labels") or {}).get(LABEL_CLUSTER)
    if not cluster or not meta.get("namespace"):
        return None
    return (str(meta["namespace"]), str(cluster))


class ChildStore:
    """The stored kinds' children of every watched cluster."""

    def __init__(self) -> None:
        self._clusters: dict[ClusterKey, dict[tuple[str, str], Manifest]] = {}

    def seen(self, body: Mapping[str, Any], *, gone: bool) -> None:
        """A watch event of a child (gone: it was deleted); others are ignored."""
        kind = body.get("kind")
        key = cluster_of(body)
        if kind not in STORED_KINDS or key is None:
            return
        name = (str(kind), str((body.get("metadata") or {}).get("name")))
        if gone:
            children = self._clusters.get(key)
            if children is not None:
                children.pop(name, None)
                if not children:
                    del self._clusters[key]
            return
        self._clusters.setdefault(key, {})[name] = comparable(body)

    def forget(self, key: ClusterKey, owner_uid: str) -> None:
        """A cluster no longer watched (deleted): drop the children it owned.
        Their DELETED events usually do this, but not when the namespace went
        and its watches were stopped first. Only the owner's: a cluster made
        again under the same name may already have children here."""
        children = self._clusters.get(key)
        if children is None:
            return
        for name, child in list(children.items()):
            if owned_by(child, owner_uid):
                del children[name]
        if not children:
            del self._clusters[key]

    def __len__(self) -> int:
        """Children stored, of every cluster."""
        return sum(map(len, self._clusters.values()))

    def of(self, key: ClusterKey) -> ClusterChildren:
        return ClusterChildren(self, key)

    def get(self, key: ClusterKey, kind: str, name: str) -> Manifest | None:
        return self._clusters.get(key, {}).get((kind, name))


@dataclass(frozen=True)
class ClusterChildren:
    """One cluster's stored children, a live view (the watches update it)."""

    store: ChildStore
    key: ClusterKey

    def get(self, kind: str, name: str) -> Manifest | None:
        return self.store.get(self.key, kind, name)
