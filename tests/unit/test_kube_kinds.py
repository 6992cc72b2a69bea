"""Every kind the operator reads or writes resolves through kr8s's classes to
its API path and scope: with no plural table of shoal's own, a kind kr8s did
not know would fail only when the operator first touched it."""

from __future__ import annotations

from pathlib import Path

import yaml

from shoal.api import API_VERSION, KIND, PLURAL
from shoal.controller.kube import kind_of

GOLDEN = Path(__file__).parent / "golden"


def test_every_applied_kind_resolves_to_its_namespaced_api_path() -> None:
    applied = {
        (doc["apiVersion"], doc["kind"])
        for path in GOLDEN.glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    }
    assert ("apps/v1", "StatefulSet") in applied
    for api_version, kind in applied | {("v1", "Pod"), (API_VERSION, KIND)}:
        cls = kind_of(api_version, kind)
        assert (cls.version, cls.kind, cls.namespaced) == (api_version, kind, True)
    assert kind_of(API_VERSION, KIND).endpoint == PLURAL
    assert kind_of("policy/v1", "PodDisruptionBudget").endpoint == "poddisruptionbudgets"


def test_nodes_are_cluster_scoped() -> None:
    assert kind_of("v1", "Node").namespaced is False
