"""The engine StatefulSets of one replica (ARCHITECTURE section 3): the leader
`<cluster>-r<i>` (one pod, the API server) and, when the replica needs more
GPUs than a node has, the workers `<cluster>-r<i>-w` (`--headless` ranks).

Pure: a spec in, manifests out. What one replica's StatefulSet looks like is
answered here and pinned by the golden files in tests/unit/golden."""

from __future__ import annotations

import math
import posixpath
from typing import Any

from shoal.api.capacity import resolve_architecture
from shoal.api.engine_env import ManagedEnv
from shoal.api.spec import VLLMClusterSpec
from shoal.controller import cache, mounts, placement
from shoal.controller.identity import ClusterRef, Manifest, object_meta
from shoal.controller.names import (
    COMPONENT_ENGINE,
    CONDITION_WARMED,
    ENGINE_PORT,
    FIRST_WORKER_ORDINAL,
    LABEL_REPLICA,
    LABEL_ROLE,
    ROLE_LEADER,
    ROLE_WORKER,
    cluster_labels,
    engine_service_name,
    leader_address,
    leader_set_name,
    set_selector,
    worker_set_name,
)
from shoal.controller.pods import with_pod_settings
from shoal.schema.quantity import parse_quantity

GiB = 1 << 30

MODEL_MOUNT = mounts.MODEL.path
HF_HOME = mounts.HF_CACHE.path
# vLLM answers /health only once the model is loaded; the startup probe's
# budget (health.startupTimeoutSeconds) is spent in steps of this period.
STARTUP_PROBE_PERIOD_SECONDS = 10
# After its drain, how long a stopping engine has to tear down (free the GPUs,
# end its workers) before kubelet kills it: kubelet's own default grace.
ENGINE_TEARDOWN_SECONDS = 30


def gpus_per_replica(spec: VLLMClusterSpec) -> int:
    return spec.parallelism.tensor * spec.parallelism.pipeline


def nodes_per_replica(spec: VLLMClusterSpec) -> int:
    return math.ceil(gpus_per_replica(spec) / spec.gpu.per_node)


def gpus_per_pod(spec: VLLMClusterSpec) -> int:
    # A multi-node replica fills whole nodes (the planner refuses partial ones).
    return min(gpus_per_replica(spec), spec.gpu.per_node)


def served_model_name(spec: VLLMClusterSpec) -> str:
    return spec.model.served_name or spec.model.name


def model_argument(spec: VLLMClusterSpec) -> str:
    """What `vllm serve` loads: the model directory on the mounted PVC, the
    Hub id, or model.name."""
    source = spec.model.source
    if source is not None and source.pvc is not None:
        return posixpath.normpath(posixpath.join(MODEL_MOUNT, source.pvc.path.lstrip("/")))
    if cache.uses_shared(spec):
        return cache.model_path(spec)
    if source is not None and source.hf is not None and source.hf.id:
        return source.hf.id
    return spec.model.name


def engine_args(spec: VLLMClusterSpec) -> list[str]:
    """`vllm serve` arguments every rank of a replica shares, from the spec."""
    parallel, engine = spec.parallelism, spec.engine
    args = [
        model_argument(spec),
        "--port",
        str(ENGINE_PORT),
        "--served-model-name",
        served_model_name(spec),
        "--tensor-parallel-size",
        str(parallel.tensor),
        "--pipeline-parallel-size",
        str(parallel.pipeline),
    ]
    if parallel.decode_context > 1:
        args += ["--decode-context-parallel-size", str(parallel.decode_context)]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    args += ["--gpu-memory-utilization", format(engine.gpu_memory_utilization, "g")]
    if engine.prefix_caching:
        # sha256_cbor: block hashes anyone can recompute (the router, warm-up checks).
        args += ["--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor"]
    else:
        args += ["--no-enable-prefix-caching"]
    if engine.shutdown_timeout_seconds:
        args += ["--shutdown-timeout", str(engine.shutdown_timeout_seconds)]
    source = spec.model.source
    # A downloaded directory is that revision already.
    rev = source.hf.revision if source is not None and source.hf is not None else None
    if rev and not cache.uses_shared(spec):
        args += ["--revision", rev]
    return args + list(engine.extra_args)


def _group_args(ref: ClusterRef, spec: VLLMClusterSpec, *, index: int, rank: str) -> list[str]:
    nodes = nodes_per_replica(spec)
    if nodes == 1:
        return []
    return [
        "--nnodes",
        str(nodes),
        "--node-rank",
        rank,
        "--master-addr",
        leader_address(ref.name, ref.namespace, index=index),
    ]


def default_requests(spec: VLLMClusterSpec) -> dict[str, str]:
    """What an engine pod requests unless the spec says: CPU 2 per GPU plus 2
    (a worker process per GPU, the API server and the engine core); memory
    /dev/shm (memory-backed, charged to the pod) plus 4Gi plus the pod's share
    of the weights, which vLLM stages through host memory while loading (8Gi
    per GPU when the model's size is unknown). Requests only: a memory limit
    would turn a load's peak into an OOMKill."""
    gpus = gpus_per_pod(spec)
    arch = resolve_architecture(spec.model)
    staged = arch.weight_bytes / nodes_per_replica(spec) if arch is not None else gpus * 8 * GiB
    memory = parse_quantity(spec.engine.shm_size) + 4 * GiB + staged
    return {"cpu": str(2 * gpus + 2), "memory": f"{math.ceil(memory / GiB)}Gi"}


def _resources(spec: VLLMClusterSpec) -> dict[str, Any]:
    given = spec.engine.resources
    resources = given.manifest() if given is not None else {}
    requests = resources.setdefault("requests", {})
    limits = resources.setdefault("limits", {})
    for key, value in default_requests(spec).items():
        requests.setdefault(key, _at_most(value, limits.get(key)))
    limits[spec.gpu.resource] = str(gpus_per_pod(spec))
    return resources


def _at_most(derived: str, limit: Any) -> Any:
    """A derived request capped at the spec's limit: the API server refuses a request
    above its limit (a limit alone is also what Kubernetes requests by default)."""
    if limit is None:
        return derived
    try:
        return limit if parse_quantity(str(limit)) < parse_quantity(derived) else derived
    except ValueError:  # the API server names the spec's malformed limit
        return derived


def _model_env(spec: VLLMClusterSpec) -> list[dict[str, Any]]:
    source = spec.model.source
    if source is not None and source.pvc is not None:
        return []
    env: list[dict[str, Any]] = [{"name": ManagedEnv.HF_HOME.value, "value": HF_HOME}]
    if cache.uses_shared(spec):
        # Loaded from the claim: a missing file is an error, not a download.
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    return env + cache.token_env(spec)


def api_key_env(spec: VLLMClusterSpec) -> list[dict[str, Any]]:
    """VLLM_API_KEY from spec.engine.apiKeySecret: vLLM reads it when no
    --api-key is given (vllm/entrypoints/serve/middleware/register.py), so the
    key stays out of the arguments, the pod spec and `ps`."""
    secret = spec.engine.api_key_secret
    if secret is None:
        return []
    ref = {"name": secret.name, "key": secret.key}
    return [{"name": ManagedEnv.API_KEY.value, "valueFrom": {"secretKeyRef": ref}}]


def _volumes(
    ref: ClusterRef, spec: VLLMClusterSpec
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): /dev/shm for NCCL, the model's PVC or a Hub cache (on the
    node with a node cache), and the shared cache's claim."""
    # Memory-backed: the container runtime's 64Mi /dev/shm is too small for NCCL.
    shm = {"medium": "Memory", "sizeLimit": spec.engine.shm_size}
    volumes: list[dict[str, Any]] = [{"name": mounts.SHM.name, "emptyDir": shm}]
    mounted: list[dict[str, Any]] = [mounts.SHM.volume_mount()]
    source = spec.model.source
    if source is not None and source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        volumes.append({"name": mounts.MODEL.name, "persistentVolumeClaim": claim})
        mounted.append(mounts.MODEL.volume_mount(read_only=True))
    else:
        host = cache.node_cache_path(spec)
        # On the node, so a restarted or rolled pod there finds the files.
        hf_cache = (
            {"hostPath": {"path": host, "type": "DirectoryOrCreate"}}
            if host is not None
            else {"emptyDir": {}}
        )
        volumes.append({"name": mounts.HF_CACHE.name, **hf_cache})
        mounted.append(mounts.HF_CACHE.volume_mount())
    if cache.uses_shared(spec):
        claim = {"claimName": cache.claim_name(ref, spec), "readOnly": True}
        volumes.append({"name": mounts.SHARED_CACHE.name, "persistentVolumeClaim": claim})
        mounted.append(mounts.SHARED_CACHE.volume_mount(read_only=True))
    return volumes, mounted


def _health_probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _pod_labels(ref: ClusterRef, *, index: int, role: str) -> dict[str, str]:
    return {
        **cluster_labels(ref.name, COMPONENT_ENGINE),
        LABEL_REPLICA: str(index),
        LABEL_ROLE: role,
    }


def _pod_spec(ref: ClusterRef, spec: VLLMClusterSpec, *, index: int, role: str) -> dict[str, Any]:
    volumes, mounts = _volumes(ref, spec)
    env = _model_env(spec)
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.image,
        "command": ["vllm", "serve"],
        # vLLM writes no termination message; its log's last lines (a 401 from
        # the Hub, a refused flag, an OOM) become the container's, which the
        # operator turns into Degraded's message and the fix it names.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if role == ROLE_LEADER:
        container["args"] = engine_args(spec) + _group_args(ref, spec, index=index, rank="0")
        container["ports"] = [{"name": "http", "containerPort": ENGINE_PORT}]
        # vLLM refuses connections while loading and answers 503 only once its
        # engine is dead, so /health serves startup, liveness and readiness.
        startup_failures = math.ceil(
            spec.health.startup_timeout_seconds / STARTUP_PROBE_PERIOD_SECONDS
        )
        container["startupProbe"] = _health_probe(STARTUP_PROBE_PERIOD_SECONDS, startup_failures)
        container["livenessProbe"] = _health_probe(10, 3)
        container["readinessProbe"] = _health_probe(5, 2)
        # Only the leader serves HTTP; /health stays open with a key (vLLM guards /v1 ...).
        env += api_key_env(spec)
    else:
        # Workers serve no HTTP; the StatefulSet's ordinals start at 1, so a
        # worker's pod index is its node rank.
        env.append(
            {
                "name": ManagedEnv.NODE_RANK.value,
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
                },
            }
        )
        container["args"] = [
            *engine_args(spec),
            "--headless",
            *_group_args(ref, spec, index=index, rank=f"$({ManagedEnv.NODE_RANK})"),
        ]
    container["env"] = env + list(spec.engine.env)
    container["resources"] = _resources(spec)
    container["volumeMounts"] = mounts
    pod: dict[str, Any] = {
        # Engines need no Kubernetes API access.
        "automountServiceAccountToken": False,
        "nodeSelector": placement.node_selector(spec),
        "tolerations": placement.tolerations(spec),
        "affinity": placement.affinity(
            spec, cluster=ref.name, index=index, nodes=nodes_per_replica(spec)
        ),
        "containers": [container],
        "volumes": volumes,
        # vLLM's drain (--shutdown-timeout), then its teardown within
        # kubelet's default.
        "terminationGracePeriodSeconds": spec.engine.shutdown_timeout_seconds
        + ENGINE_TEARDOWN_SECONDS,
    }
    if not pod["nodeSelector"]:
        del pod["nodeSelector"]
    if not pod["affinity"]:
        del pod["affinity"]
    if role == ROLE_LEADER:
        # Not Ready, so no router sends it traffic, until shoal admits it.
        pod["readinessGates"] = [{"conditionType": CONDITION_WARMED}]
    return pod


def _statefulset(
    ref: ClusterRef, spec: VLLMClusterSpec, *, index: int, role: str, name: str, pods: int
) -> Manifest:
    labels = _pod_labels(ref, index=index, role=role)
    set_spec: dict[str, Any] = {
        "replicas": pods,
        "serviceName": engine_service_name(ref.name),
        "podManagementPolicy": "Parallel",
        # shoal replaces pods itself: whole groups, rollout.maxUnavailable
        # replicas at a time, each only after the last is warm and Ready.
        "updateStrategy": {"type": "OnDelete"},
        "selector": {"matchLabels": set_selector(ref.name, index, role=role)},
        "template": with_pod_settings(
            {"metadata": {"labels": labels}, "spec": _pod_spec(ref, spec, index=index, role=role)},
            spec.engine.pod,
        ),
    }
    if role == ROLE_WORKER:
        set_spec["ordinals"] = {"start": FIRST_WORKER_ORDINAL}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(ref, name, labels=labels),
        "spec": set_spec,
    }


def build_leader_statefulset(ref: ClusterRef, spec: VLLMClusterSpec, *, index: int) -> Manifest:
    """Replica index's leader: one pod with the API server, the readiness gate
    and, for a multi-node replica, rank 0 of the group."""
    name = leader_set_name(ref.name, index)
    return _statefulset(ref, spec, index=index, role=ROLE_LEADER, name=name, pods=1)


def build_worker_statefulset(
    ref: ClusterRef, spec: VLLMClusterSpec, *, index: int
) -> Manifest | None:
    """Replica index's headless ranks 1..n-1, or None when one node holds the replica."""
    nodes = nodes_per_replica(spec)
    if nodes == 1:
        return None
    name = worker_set_name(ref.name, index)
    return _statefulset(ref, spec, index=index, role=ROLE_WORKER, name=name, pods=nodes - 1)
