"""The router of one cluster (ARCHITECTURE section 4): `spec.router` as the
router's own `router.json`, and the Deployment, Service, ConfigMap, PodDisruptionBudget,
ServiceAccount, Role and RoleBinding that run it. Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from shoal.api.router import CLOSE_SECONDS, INTERNAL_PORT
from shoal.api.spec import VLLMClusterSpec
from shoal.controller import mounts
from shoal.controller.identity import ClusterRef, Manifest, object_meta
from shoal.controller.names import (
    ANNOTATION_ROUTER_CONFIG_HASH,
    COMPONENT_ROUTER,
    ENGINE_PORT,
    ROUTER_PORT,
    cluster_labels,
    leader_selector_text,
    router_name,
    router_selector,
    selector_text,
)
from shoal.controller.pods import pull_secret_entries, with_pod_settings
from shoal.router.config import RouterConfig

CONFIG_DIR = mounts.ROUTER_CONFIG.path
CONFIG_FILE = "router.json"
API_KEYS_DIR = mounts.API_KEYS.path
ENGINE_KEY_DIR = mounts.ENGINE_KEY.path


def router_config(spec: VLLMClusterSpec) -> RouterConfig:
    """spec.router's routing settings as they are, plus the engines' per-replica
    maxNumSeqs. The API key Secrets are not in it: the router gets the mounted
    files' paths on its command line (`--api-key-file`, `--engine-key-file`), as
    secrets go to a pod."""
    return RouterConfig.for_cluster(spec.router, max_num_seqs=spec.engine.max_num_seqs)


def render_router_config(spec: VLLMClusterSpec) -> str:
    """router.json: every field written out, keys sorted, so equal specs give equal bytes."""
    config = router_config(spec).model_dump(mode="json", by_alias=True)
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _labels(ref: ClusterRef) -> dict[str, str]:
    return cluster_labels(ref.name, COMPONENT_ROUTER)


def build_router_configmap(ref: ClusterRef, spec: VLLMClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(ref, router_name(ref.name), labels=_labels(ref)),
        "data": {CONFIG_FILE: render_router_config(spec)},
    }


def build_router_service_account(ref: ClusterRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(ref, router_name(ref.name), labels=_labels(ref)),
    }


def build_router_role(ref: ClusterRef) -> Manifest:
    """The router only discovers leader pods: get, list and watch pods, nothing else."""
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(ref, router_name(ref.name), labels=_labels(ref)),
        "rules": [rule],
    }


def build_router_role_binding(ref: ClusterRef) -> Manifest:
    name = router_name(ref.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta(ref, name, labels=_labels(ref)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ref.namespace}],
    }


def build_router_service(ref: ClusterRef, spec: VLLMClusterSpec) -> Manifest:
    service = spec.router.service
    metadata = object_meta(ref, router_name(ref.name), labels=_labels(ref))
    if service.annotations:
        metadata["annotations"] = {**service.annotations, **metadata.get("annotations", {})}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": service.type,
            "selector": router_selector(ref.name),
            "ports": [{"name": "http", "port": service.port, "targetPort": "http"}],
        },
    }


def build_router_pdb(ref: ClusterRef, spec: VLLMClusterSpec) -> Manifest:
    """A node drain takes router pods spec.router.maxUnavailable at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(ref, router_name(ref.name), labels=_labels(ref)),
        "spec": {
            "maxUnavailable": spec.router.max_unavailable,
            "selector": {"matchLabels": router_selector(ref.name)},
        },
    }


# What the restricted Pod Security Standard asks, so that routers run in a
# namespace that enforces it; the image runs as a non-root user and writes
# nothing. spec.router.pod's securityContext and containerSecurityContext
# replace these.
def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _spread(ref: ClusterRef) -> dict[str, Any]:
    """Router pods preferably on different nodes: one node lost leaves the endpoint up."""
    term = {
        "labelSelector": {"matchLabels": router_selector(ref.name)},
        "topologyKey": "kubernetes.io/hostname",
    }
    preferred = [{"weight": 100, "podAffinityTerm": term}]
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}


def config_hash(configmap: Manifest) -> str:
    text = json.dumps(configmap["data"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_router_deployment(
    ref: ClusterRef,
    spec: VLLMClusterSpec,
    *,
    image: str,
    configmap: Manifest,
    pull_secrets: Sequence[str] = (),
) -> Manifest:
    """`shoal router --kubernetes`, reading router.json from the ConfigMap and
    API keys (if any) from the mounted Secret; the ConfigMap's hash on the pod
    template rolls the router (only) when it changes. pull_secrets are the
    operator's own (the chart's imagePullSecrets), for the router image, which is
    the operator's; spec.router.pod's are added to them."""
    name = router_name(ref.name)
    router = spec.router
    args = [
        "router",
        "--host",
        "0.0.0.0",
        "--port",
        str(ROUTER_PORT),
        "--config",
        f"{CONFIG_DIR}/{CONFIG_FILE}",
        "--kubernetes",
        "--namespace",
        ref.namespace,
        "--selector",
        leader_selector_text(ref.name),
        "--engine-port",
        str(ENGINE_PORT),
        # The probes' port, apart from the clients' connections.
        "--serve-internal",
    ]
    env: list[dict[str, Any]] = []
    if router.share_placements:
        # The other router pods, whose placements this one reads; itself left out by name.
        args += ["--peer-selector", selector_text(router_selector(ref.name))]
        env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    # On the internal port: clients holding every connection the client port
    # allows (kept-alive pools, long streams) would have liveness restart a
    # router that serves them all.
    probe = {"httpGet": {"path": "/health", "port": "internal"}, "periodSeconds": 5}
    mounted = [mounts.ROUTER_CONFIG.volume_mount(read_only=True)]
    volumes: list[dict[str, Any]] = [
        {"name": mounts.ROUTER_CONFIG.name, "configMap": {"name": name}}
    ]
    if router.api_key_secret is not None:
        args += ["--api-key-file", f"{API_KEYS_DIR}/{router.api_key_secret.key}"]
        mounted.append(mounts.API_KEYS.volume_mount(read_only=True))
        secret = {"secretName": router.api_key_secret.name}
        volumes.append({"name": mounts.API_KEYS.name, "secret": secret})
    engine_key = spec.engine.api_key_secret
    if engine_key is not None:
        # A mounted file, re-read when kubelet updates it (router/keys.py).
        args += ["--engine-key-file", f"{ENGINE_KEY_DIR}/{engine_key.key}"]
        mounted.append(mounts.ENGINE_KEY.volume_mount(read_only=True))
        volumes.append({"name": mounts.ENGINE_KEY.name, "secret": {"secretName": engine_key.name}})
    container: dict[str, Any] = {
        "name": "router",
        "image": image,
        "command": ["shoal"],
        "args": args,
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT},
            # Probes, metrics for the autoscaler, hot prefixes and placements:
            # for kubelet, the operator and the other routers.
            {"name": "internal", "containerPort": INTERNAL_PORT},
        ],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 3},
        # Liveness waits until the router listens: on a busy node its start
        # (imports, config) outlasted liveness's 15 s and kubelet killed it
        # over and over (the testbed's real node, tests/node).
        "startupProbe": {**probe, "periodSeconds": 2, "failureThreshold": 90},
        "volumeMounts": mounted,
        "securityContext": container_security(),
    }
    if router.shutdown_delay_seconds:
        # Serving on while the endpoint leaves every node's rules and the
        # balancers; the router drains once told to stop (SIGTERM).
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": router.shutdown_delay_seconds}}}
    if env:
        container["env"] = env
    resources = router.resources.manifest() if router.resources is not None else {}
    if resources:
        container["resources"] = resources
    labels = _labels(ref)
    pod: dict[str, Any] = {
        "securityContext": pod_security(),
        "serviceAccountName": name,
        "affinity": _spread(ref),
        "containers": [container],
        "volumes": volumes,
        # The delay, the drain, the close of what is left, and as long again
        # for the rest of the stop: kubelet's default 30 s cut drains short.
        "terminationGracePeriodSeconds": (
            router.shutdown_delay_seconds + router.drain_seconds + 2 * CLOSE_SECONDS
        ),
    }
    if pull_secrets:
        pod["imagePullSecrets"] = pull_secret_entries(pull_secrets)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(ref, name, labels=labels),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": router_selector(ref.name)},
            "template": with_pod_settings(
                {
                    "metadata": {
                        "labels": labels,
                        "annotations": {ANNOTATION_ROUTER_CONFIG_HASH: config_hash(configmap)},
                    },
                    "spec": pod,
                },
                router.pod,
            ),
        },
    }
