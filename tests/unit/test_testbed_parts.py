"""Pure parts of the testbed: fake nodes, kubelet-style env and $(VAR)
expansion, the pod runner's rules, and the kwok stage file."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import yaml

from shoal_testbed import nodes, podfs, podspec, rules

STAGES = Path(__file__).resolve().parents[2] / "hack" / "testbed" / "kwok-stages.yaml"


def test_gpu_nodes_advertise_gpus_product_and_taint_and_a_loopback_pod_cidr() -> None:
    built = nodes.build_nodes(octet=123)
    gpu = [n for n in built if nodes.GPU_RESOURCE in n["status"]["allocatable"]]
    products = {n["metadata"]["labels"][nodes.GPU_PRODUCT_LABEL] for n in gpu}
    assert len(gpu) == 5 and len(products) == 2
    assert (
        sum(
            1
            for n in gpu
            if n["metadata"]["labels"][nodes.GPU_PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
        )
        == 4
    )
    for node in gpu:
        assert node["status"]["allocatable"][nodes.GPU_RESOURCE] == "8"
        assert nodes.GPU_TAINT in node["spec"]["taints"]
    cidrs = [ipaddress.IPv4Network(n["spec"]["podCIDR"]) for n in built]
    assert all(c.subnet_of(ipaddress.IPv4Network("127.123.0.0/16")) for c in cidrs)
    assert len(set(cidrs)) == len(cidrs), "two nodes share a pod CIDR"
    cpu_only = [n for n in built if n not in gpu]
    assert cpu_only and not cpu_only[0]["spec"]["taints"]


def test_expand_follows_kubernetes_rules() -> None:
    env = {"PORT": "8000", "HOST": "127.1.1.2"}
    assert podspec.expand("--port=$(PORT)", env) == "--port=8000"
    assert podspec.expand("$(MISSING)", env) == "$(MISSING)"
    assert podspec.expand("$$(PORT)", env) == "$(PORT)"
    assert podspec.expand("$(HOST):$(PORT)", env) == "127.1.1.2:8000"


POD: dict[str, Any] = {
    "metadata": {
        "name": "engine-0",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"replica": "0"},
        "annotations": {rules.RUN_ANNOTATION: "web"},
    },
    "spec": {
        "nodeName": "gpu-h100-0",
        "containers": [
            {
                "name": "web",
                "command": ["python3", "-m", "http.server"],
                "args": ["--bind", "$(MY_IP)", "$(PORT)"],
                "env": [
                    {"name": "PORT", "value": "8080"},
                    {"name": "URL", "value": "http://$(MY_IP):$(PORT)"},
                    {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {
                        "name": "REPLICA",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['replica']"}},
                    },
                ],
            }
        ],
    },
    "status": {"phase": "Running", "podIP": "127.5.1.3"},
}


def test_annotated_container_runs_its_own_command_with_downward_api_env() -> None:
    launch = rules.annotated_container(POD)
    assert launch is not None
    assert launch.argv == ["python3", "-m", "http.server", "--bind", "127.5.1.3", "8080"]
    assert launch.env["MY_IP"] == "127.5.1.3"
    assert launch.env["REPLICA"] == "0"
    # Earlier entries expand in later ones; later ones do not exist yet (kubelet order).
    assert launch.env["URL"] == "http://$(MY_IP):8080"


def test_pods_without_the_annotation_are_left_alone() -> None:
    pod = {**POD, "metadata": {**POD["metadata"], "annotations": {}}}
    assert rules.annotated_container(pod) is None
    missing = {
        **POD,
        "metadata": {**POD["metadata"], "annotations": {rules.RUN_ANNOTATION: "nope"}},
    }
    assert rules.annotated_container(missing) is None


def test_stage_file_replaces_kwoks_gate_blind_pod_ready() -> None:
    stages = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(STAGES.read_text())}
    assert {
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-readiness-gates",
        "pod-delete",
    } <= set(stages)
    ready_template = stages["pod-ready"]["spec"]["next"]["statusTemplate"]
    # kwok's default writes every gate as True; ours must only read them.
    assert ".spec.readinessGates" in ready_template
    assert "type: {{ .conditionType" not in ready_template


def _vllm_pod(command: list[str], args: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c-r0-0", "namespace": "ns", "uid": "u"},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai:v0.32.0",
                    "command": command,
                    "args": args,
                    "env": [{"name": "PORT", "value": "8000"}],
                }
            ]
        },
        "status": {"phase": "Running", "podIP": "127.9.1.4"},
    }


def test_vllm_pods_run_the_simulator_with_their_own_arguments_on_the_pod_ip() -> None:
    launch = rules.vllm_engine(_vllm_pod(["vllm", "serve"], ["meta/llama", "--port", "$(PORT)"]))
    assert launch is not None
    assert launch.argv[1:] == [
        "-m",
        "shoal.cli",
        "sim",
        "meta/llama",
        "--port",
        "8000",
        "--host",
        "127.9.1.4",
    ]
    bare = rules.vllm_engine(_vllm_pod([], ["--model", "m"]))
    assert bare is not None and bare.argv[3:6] == ["sim", "--model", "m"]
    assert rules.vllm_engine(_vllm_pod(["bash", "-c", "sleep 1"], [])) is None


def _node_cached_pod(node: str, host: Path) -> dict[str, Any]:
    pod = _vllm_pod(["vllm", "serve"], ["org/tiny"])
    pod["spec"]["nodeName"] = node
    engine = pod["spec"]["containers"][0]
    engine["env"].append({"name": "HF_HOME", "value": "/cache/huggingface"})
    engine["volumeMounts"] = [{"name": "hf-cache", "mountPath": "/cache/huggingface"}]
    volume = {"path": str(host), "type": "DirectoryOrCreate"}
    pod["spec"]["volumes"] = [{"name": "hf-cache", "hostPath": volume}]
    return pod


def test_a_hub_model_with_its_cache_on_the_node_is_fetched_there_by_the_simulator(
    tmp_path: Path,
) -> None:
    launch = rules.vllm_engine(_node_cached_pod("gpu-0", tmp_path))
    assert launch is not None
    assert launch.argv[-2:] == ["--sim-load-model", "--sim-hf-home=/cache/huggingface"]
    without = rules.vllm_engine(_vllm_pod(["vllm", "serve"], ["org/tiny"]))
    assert without is not None and "--sim-load-model" not in without.argv


def test_a_host_path_is_its_nodes_own_directory(tmp_path: Path) -> None:
    def host_of(node: str) -> str:
        pod = _node_cached_pod(node, tmp_path)
        (mount,) = podfs.host_mounts(None, pod, pod["spec"]["containers"][0])  # type: ignore[arg-type]
        return mount.host

    assert host_of("gpu-0") == str(tmp_path / "gpu-0") != host_of("gpu-1")
    assert (tmp_path / "gpu-1").is_dir()  # DirectoryOrCreate
