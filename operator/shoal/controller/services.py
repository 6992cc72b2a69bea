"""The engines' headless Service and PodDisruptionBudget. Pure."""

from __future__ import annotations

from shoal.api.spec import VLLMClusterSpec
from shoal.controller.identity import ClusterRef, Manifest, object_meta
from shoal.controller.names import (
    COMPONENT_ENGINE,
    ENGINE_PORT,
    cluster_labels,
    engine_selector,
    engine_service_name,
    pdb_name,
)


def build_engine_service(ref: ClusterRef) -> Manifest:
    """Stable DNS names for engine pods (`<cluster>-r<i>-0.<cluster>-engines`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(
            ref, engine_service_name(ref.name), labels=cluster_labels(ref.name, COMPONENT_ENGINE)
        ),
        "spec": {
            "clusterIP": "None",
            # Workers must resolve their leader while it is still not Ready:
            # a group only becomes Ready once all its ranks have joined.
            "publishNotReadyAddresses": True,
            "selector": engine_selector(ref.name),
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
        },
    }


def build_engine_pdb(ref: ClusterRef, spec: VLLMClusterSpec) -> Manifest:
    """Voluntary disruptions (node drains) take engines no faster than a rollout does."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(
            ref, pdb_name(ref.name), labels=cluster_labels(ref.name, COMPONENT_ENGINE)
        ),
        "spec": {
            "maxUnavailable": spec.rollout.max_unavailable,
            "selector": {"matchLabels": engine_selector(ref.name)},
        },
    }
