"""The store of watched children: what a pass compares Services, the
ConfigMap, PDBs and RBAC with, kept from the watches' events."""

from __future__ import annotations

from typing import Any

from shoal.controller.children import ChildStore, comparable
from shoal.controller.names import LABEL_CLUSTER


def _child(kind: str, name: str, *, cluster: str = "fleet", ns: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {LABEL_CLUSTER: cluster},
            "managedFields": [{"manager": "shoal"}],
        },
        "spec": {"ports": [{"port": 80}]},
        "status": {"loadBalancer": {}},
    }


def test_a_childs_events_keep_its_latest_body_until_it_is_deleted() -> None:
    store = ChildStore()
    view = store.of(("team-a", "fleet"))
    service = _child("Service", "fleet-router")
    store.seen(service, gone=False)
    assert view.get("Service", "fleet-router") == comparable(service)
    changed = _child("Service", "fleet-router")
    changed["spec"]["ports"][0]["port"] = 8080
    store.seen(changed, gone=False)
    found = view.get("Service", "fleet-router")
    assert found is not None and found["spec"]["ports"][0]["port"] == 8080
    store.seen(changed, gone=True)
    assert view.get("Service", "fleet-router") is None


def test_children_are_kept_by_cluster_and_kind() -> None:
    store = ChildStore()
    store.seen(_child("Service", "x", cluster="one"), gone=False)
    store.seen(_child("ConfigMap", "x", cluster="one"), gone=False)
    store.seen(_child("Service", "x", cluster="one", ns="team-b"), gone=False)
    store.seen(_child("Service", "x", cluster="two"), gone=True)  # another's going
    assert store.get(("team-a", "one"), "Service", "x") is not None
    assert store.get(("team-a", "one"), "ConfigMap", "x") is not None
    assert store.get(("team-b", "one"), "Service", "x") is not None
    assert store.get(("team-a", "two"), "Service", "x") is None


def test_kinds_a_pass_lists_itself_and_unlabelled_objects_are_not_kept() -> None:
    store = ChildStore()
    store.seen(_child("Pod", "fleet-r0-0"), gone=False)
    unlabelled = _child("Service", "other")
    del unlabelled["metadata"]["labels"]
    store.seen(unlabelled, gone=False)
    assert store.get(("team-a", "fleet"), "Pod", "fleet-r0-0") is None
    assert store.get(("team-a", "fleet"), "Service", "other") is None


def test_status_and_managed_fields_are_not_compared_and_the_event_body_is_copied() -> None:
    service = _child("Service", "fleet-router")
    kept = comparable(service)
    assert "status" not in kept and "managedFields" not in kept["metadata"]
    service["spec"]["ports"][0]["port"] = 1
    assert kept["spec"]["ports"][0]["port"] == 80


def _owned(kind: str, name: str, uid: str) -> dict[str, Any]:
    child = _child(kind, name)
    child["metadata"]["ownerReferences"] = [
        {"kind": "VLLMCluster", "name": "fleet", "uid": uid, "controller": True}
    ]
    return child


def test_a_deleted_clusters_children_leave_with_it_but_not_a_new_one_of_the_same_name() -> None:
    # DELETED events of the children do not come when the namespace's watches
    # stop first: what the deleted cluster owned must not stay for good.
    store = ChildStore()
    key = ("team-a", "fleet")
    store.seen(_owned("Service", "fleet-router", "old"), gone=False)
    store.seen(_owned("ConfigMap", "fleet-router", "old"), gone=False)
    store.seen(_owned("Service", "fleet-engines", "new"), gone=False)  # made again
    store.forget(key, "old")
    assert store.get(key, "Service", "fleet-router") is None
    assert store.get(key, "ConfigMap", "fleet-router") is None
    assert store.get(key, "Service", "fleet-engines") is not None
    store.forget(key, "new")
    assert store.get(key, "Service", "fleet-engines") is None
    assert len(store) == 0
