"""The manifests a VLLMCluster turns into: engine StatefulSets per replica
(ARCHITECTURE section 3), the router and its config (section 4), the engines'
Service and PDB."""

from __future__ import annotations

import json
from typing import Any

from shoal.api.router import CLOSE_SECONDS, RouterPolicy
from shoal.controller.desired import desired_fleet, manifest_hash
from shoal.controller.names import CONDITION_WARMED, ROLE_LEADER
from shoal.controller.router import router_config
from shoal.router.config import RouterConfig
from tests.unit.controller_samples import REF, ROUTER_IMAGE, fleet_of, spec_of


def _pod(statefulset: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = statefulset["spec"]["template"]["spec"]
    return pod


def _args(statefulset: dict[str, Any]) -> list[str]:
    args: list[str] = _pod(statefulset)["containers"][0]["args"]
    return args


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_a_tp4_replica_is_one_pod_holding_four_gpus_on_the_product_it_asks_for() -> None:
    spec = spec_of(
        replicas=2,
        parallelism={"tensor": 4},
        gpu={"product": "NVIDIA-H100-80GB-HBM3"},
        engine={"maxModelLen": 8192, "extraArgs": ["--sim-time-scale", "50"]},
    )
    fleet = fleet_of(spec)
    assert [r.index for r in fleet.replicas] == [0, 1]
    replica = fleet.replicas[1]
    assert replica.worker is None
    leader = replica.leader
    assert leader["metadata"]["name"] == "c-r1"
    assert leader["spec"]["replicas"] == 1
    pod = _pod(leader)
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["readinessGates"] == [{"conditionType": CONDITION_WARMED}]
    labels = pod and leader["spec"]["template"]["metadata"]["labels"]
    assert labels["serving.shoal.dev/cluster"] == "c"
    assert labels["serving.shoal.dev/replica"] == "1"
    assert labels["serving.shoal.dev/role"] == ROLE_LEADER
    assert labels["app.kubernetes.io/managed-by"] == "shoal"


def test_vllm_flags_come_from_the_spec_and_extra_args_come_last() -> None:
    spec = spec_of(
        model={"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama"},
        parallelism={"tensor": 4, "pipeline": 2},
        engine={
            "maxModelLen": 8192,
            "maxNumSeqs": 64,
            "maxNumBatchedTokens": 4096,
            "gpuMemoryUtilization": 0.9,
            "extraArgs": ["--block-size", "32"],
        },
    )
    args = _args(fleet_of(spec).replicas[0].leader)
    assert _pod(fleet_of(spec).replicas[0].leader)["containers"][0]["command"] == ["vllm", "serve"]
    assert args[0] == "meta-llama/Llama-3.1-70B-Instruct"
    assert _flag(args, "--tensor-parallel-size") == "4"
    assert _flag(args, "--pipeline-parallel-size") == "2"
    assert _flag(args, "--max-model-len") == "8192"
    assert _flag(args, "--max-num-seqs") == "64"
    assert _flag(args, "--max-num-batched-tokens") == "4096"
    assert _flag(args, "--gpu-memory-utilization") == "0.9"
    assert _flag(args, "--served-model-name") == "llama"
    assert "--enable-prefix-caching" in args
    assert _flag(args, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert args[-2:] == ["--block-size", "32"]
    assert "--decode-context-parallel-size" not in args
    no_cache = spec_of(engine={"maxModelLen": 8192, "prefixCaching": False})
    assert "--no-enable-prefix-caching" in _args(fleet_of(no_cache).replicas[0].leader)


def test_probes_are_on_health_and_startup_allows_the_configured_load_time() -> None:
    spec = spec_of(health={"startupTimeoutSeconds": 3600})
    container = _pod(fleet_of(spec).replicas[0].leader)["containers"][0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600


def test_a_tp16_replica_spans_two_nodes_with_a_headless_worker_on_another_node() -> None:
    spec = spec_of(
        model={"name": "meta-llama/Llama-3.1-405B-Instruct"},
        parallelism={"tensor": 16},
        placement={"topologyKey": "topology.kubernetes.io/rack"},
    )
    replica = fleet_of(spec).replicas[0]
    assert replica.worker is not None
    worker = replica.worker
    assert worker["metadata"]["name"] == "c-r0-w"
    assert worker["spec"]["replicas"] == 1
    assert worker["spec"]["ordinals"] == {"start": 1}
    leader_args, worker_args = _args(replica.leader), _args(worker)
    leader_dns = "c-r0-0.c-engines.ns.svc"
    assert _flag(leader_args, "--nnodes") == "2"
    assert _flag(leader_args, "--node-rank") == "0"
    assert _flag(leader_args, "--master-addr") == leader_dns
    assert "--headless" in worker_args and "--headless" not in leader_args
    assert _flag(worker_args, "--node-rank") == "$(NODE_RANK)"
    assert _flag(worker_args, "--master-addr") == leader_dns
    env = {e["name"]: e for e in _pod(worker)["containers"][0]["env"]}
    assert (
        env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    for statefulset in (replica.leader, worker):
        pod = _pod(statefulset)
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        group = {"serving.shoal.dev/cluster": "c", "serving.shoal.dev/replica": "0"}
        anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti == [
            {"labelSelector": {"matchLabels": group}, "topologyKey": "kubernetes.io/hostname"}
        ]
        co = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert co[0]["topologyKey"] == "topology.kubernetes.io/rack"
    assert "readinessGates" not in _pod(worker)
    assert "readinessProbe" not in _pod(worker)["containers"][0]


def test_model_sources_pvc_read_only_or_hub_id_with_token_secret() -> None:
    pvc = spec_of(
        model={
            "name": "/models/llama",
            "source": {"pvc": {"claimName": "models", "path": "/Llama-3.1-70B-Instruct"}},
        }
    )
    pod = _pod(fleet_of(pvc).replicas[0].leader)
    container = pod["containers"][0]
    assert container["args"][0] == "/models/Llama-3.1-70B-Instruct"
    volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert mount["readOnly"] is True
    assert "HF_TOKEN" not in json.dumps(container["env"])

    hub = spec_of(
        model={
            "name": "meta-llama/Llama-3.1-70B-Instruct",
            "source": {"hf": {"revision": "v2", "tokenSecret": {"name": "hf", "key": "tok"}}},
        }
    )
    container = _pod(fleet_of(hub).replicas[0].leader)["containers"][0]
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "tok"}
    assert _flag(container["args"], "--revision") == "v2"


def test_user_placement_is_kept_beside_the_gpu_rules() -> None:
    required: dict[str, object] = {"requiredDuringSchedulingIgnoredDuringExecution": {}}
    user_affinity = {"nodeAffinity": required}
    spec = spec_of(
        placement={
            "nodeSelector": {"pool": "inference"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "affinity": user_affinity,
        }
    )
    pod = _pod(fleet_of(spec).replicas[0].leader)
    assert pod["nodeSelector"] == {"pool": "inference"}
    assert {"key": "dedicated", "operator": "Exists"} in pod["tolerations"]
    assert pod["affinity"]["nodeAffinity"] == user_affinity["nodeAffinity"]
    preferred = pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_every_object_is_owned_by_the_cluster_and_labelled_with_it() -> None:
    fleet = fleet_of(spec_of(replicas=2, parallelism={"tensor": 16}))
    for manifest in fleet.all():
        meta = manifest["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "serving.shoal.dev/v1alpha1",
                "kind": "VLLMCluster",
                "name": "c",
                "uid": REF.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["serving.shoal.dev/cluster"] == "c"
    kinds = sorted(m["kind"] for m in fleet.all())
    assert kinds == sorted(
        ["Service", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding", "ConfigMap"]
        + ["Service", "PodDisruptionBudget", "Deployment"]
        + ["StatefulSet"] * 4
    )


def test_router_config_is_spec_router_with_the_engines_max_num_seqs_and_no_key() -> None:
    spec = spec_of(
        engine={"maxModelLen": 8192, "maxNumSeqs": 96},
        router={
            "policy": "least-request",
            "weights": {"kvUsage": 0.6, "queue": 0.2, "running": 0.2},
            "thresholds": {"qNorm": 10, "saturatedKVUsage": 0.9, "prefixBlockChars": 32},
            "scrapeIntervalMilliseconds": 500,
            "timeouts": {"connectSeconds": 3, "firstByteSeconds": 30, "totalSeconds": 90},
            "retries": 1,
            "circuitBreaker": {"failureThreshold": 4, "openSeconds": 20},
            "queue": {"maxQueued": 100, "maxWaitSeconds": 5},
            "maxRequestSize": "1Mi",
            "apiKeySecret": {"name": "keys", "key": "list"},
        },
    )
    config = router_config(spec)
    assert config.policy is RouterPolicy.LEAST_REQUEST
    assert (config.weights.kv_usage, config.weights.queue) == (0.6, 0.2)
    thresholds = config.thresholds
    assert (thresholds.q_norm, thresholds.saturated_kv_usage) == (10, 0.9)
    assert thresholds.prefix_block_chars == 32
    assert config.max_num_seqs == 96
    assert config.scrape_interval_seconds == 0.5
    assert config.scrape_timeout_seconds < config.scrape_interval_seconds
    assert (config.timeouts.connect_seconds, config.timeouts.total_seconds) == (3, 90)
    assert config.retries == 1
    assert (config.circuit_breaker.failure_threshold, config.circuit_breaker.open_seconds) == (
        4,
        20,
    )
    assert (config.queue.max_queued, config.queue.max_wait_seconds) == (100, 5)
    assert config.max_body_bytes == 1024 * 1024
    # The key file's path goes on the command line (below), not into the ConfigMap.
    assert config.api_key_file is None

    fleet = fleet_of(spec)
    configmap = next(m for m in fleet.static if m["kind"] == "ConfigMap")
    # The router loads exactly what the operator wrote.
    assert RouterConfig.model_validate(json.loads(configmap["data"]["router.json"])) == config
    deployment = fleet.after[0]
    router_pod = deployment["spec"]["template"]["spec"]
    args = router_pod["containers"][0]["args"]
    assert args[0] == "router" and "--kubernetes" in args
    assert _flag(args, "--selector") == "serving.shoal.dev/cluster=c,serving.shoal.dev/role=leader"
    assert _flag(args, "--config") == "/etc/shoal/router/router.json"
    assert _flag(args, "--namespace") == "ns"
    assert router_pod["serviceAccountName"] == "c-router"
    assert _flag(args, "--api-key-file") == "/etc/shoal/api-keys/list"
    assert {"name": "api-keys", "secret": {"secretName": "keys"}} in router_pod["volumes"]
    assert {"name": "api-keys", "mountPath": "/etc/shoal/api-keys", "readOnly": True} in (
        router_pod["containers"][0]["volumeMounts"]
    )
    assert router_pod["containers"][0]["image"] == ROUTER_IMAGE


def test_a_router_without_an_api_key_secret_gets_no_key_file_and_no_secret_volume() -> None:
    router_pod = fleet_of(spec_of()).after[0]["spec"]["template"]["spec"]
    assert "--api-key-file" not in router_pod["containers"][0]["args"]
    assert [v["name"] for v in router_pod["volumes"]] == ["config"]


def test_a_stopped_engine_drains_its_requests_within_its_grace() -> None:
    # vLLM's default aborts what it runs at SIGTERM: a rollout or a node drain
    # cut every stream of the replica it stopped.
    (replica,) = fleet_of(spec_of(engine={"shutdownTimeoutSeconds": 120})).replicas
    assert _flag(_args(replica.leader), "--shutdown-timeout") == "120"
    assert _pod(replica.leader)["terminationGracePeriodSeconds"] >= 120 + 30
    (default,) = fleet_of(spec_of()).replicas
    assert _flag(_args(default.leader), "--shutdown-timeout") == "30"
    (off,) = fleet_of(spec_of(engine={"shutdownTimeoutSeconds": 0})).replicas
    assert "--shutdown-timeout" not in _args(off.leader)  # images before vLLM 0.18 lack it
    assert _pod(off.leader)["terminationGracePeriodSeconds"] == 30  # kubelet's default


def test_a_stopping_router_serves_through_its_delay_and_kubelet_waits_out_its_drain() -> None:
    # kubelet's default 30 s grace killed a router in the middle of a longer
    # drain (spec.router.drainSeconds up to an hour).
    router_pod = fleet_of(spec_of(router={"drainSeconds": 120})).after[0]["spec"]["template"]
    (container,) = router_pod["spec"]["containers"]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    grace = router_pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 5 + 120 + CLOSE_SECONDS
    none = fleet_of(spec_of(router={"shutdownDelaySeconds": 0})).after[0]["spec"]["template"]
    assert "lifecycle" not in none["spec"]["containers"][0]  # a sleep of 0 needs Kubernetes 1.33
    assert none["spec"]["terminationGracePeriodSeconds"] >= 30 + CLOSE_SECONDS


def test_the_routers_role_may_only_get_list_and_watch_pods() -> None:
    role = next(m for m in fleet_of(spec_of()).static if m["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]


def test_a_router_only_change_changes_the_router_and_no_engine_manifest() -> None:
    before = fleet_of(spec_of(replicas=2))
    after = fleet_of(spec_of(replicas=2, router={"policy": "round-robin", "retries": 0}))
    engines = [manifest_hash(m) for r in before.replicas for m in r.manifests]
    assert engines == [manifest_hash(m) for r in after.replicas for m in r.manifests]
    template = before.after[0]["spec"]["template"]["metadata"]["annotations"]
    assert template != after.after[0]["spec"]["template"]["metadata"]["annotations"]


def test_an_engine_change_changes_the_engine_manifests() -> None:
    before = fleet_of(spec_of(replicas=2))
    after = fleet_of(spec_of(replicas=2, image="vllm/vllm-openai:v0.33.0"))
    for old, new in zip(before.replicas, after.replicas, strict=True):
        assert manifest_hash(old.leader) != manifest_hash(new.leader)


def test_the_headless_service_publishes_leaders_before_they_are_ready() -> None:
    fleet = desired_fleet(REF, spec_of(), router_image=ROUTER_IMAGE)
    service = next(m for m in fleet.static if m["metadata"]["name"] == "c-engines")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pdb = next(m for m in fleet.static if m["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
