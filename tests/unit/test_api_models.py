"""The VLLMCluster models: defaults, JSON names, quantities and validation."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from shoal.api.capacity import plan_spec
from shoal.api.resource import VLLMCluster
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import CapacityStatus, VLLMClusterStatus
from shoal.api.validation import validate_cluster
from shoal.schema.model import camel
from shoal.schema.quantity import parse_quantity


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": "test"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec},
    }


def test_a_spec_with_only_a_model_gets_sensible_defaults() -> None:
    spec = VLLMClusterSpec.model_validate({"model": {"name": "meta-llama/Llama-3.1-8B"}})
    assert spec.image == "vllm/vllm-openai:v0.32.0"
    assert spec.replicas == 1
    assert (spec.parallelism.tensor, spec.parallelism.pipeline) == (1, 1)
    assert spec.parallelism.decode_context == 1
    assert spec.gpu.resource == "nvidia.com/gpu"
    assert spec.engine.gpu_memory_utilization == 0.92
    assert spec.engine.prefix_caching is True
    assert spec.router.policy == "cache-aware"
    weights = spec.router.weights
    assert (weights.kv_usage, weights.queue, weights.running) == (0.5, 0.3, 0.2)
    thresholds = spec.router.thresholds
    assert (thresholds.beta, thresholds.epsilon, thresholds.q_norm) == (1.0, 0.25, 20)
    assert thresholds.affinity_threshold == 0.7
    assert spec.warmup.enabled and spec.warmup.on_timeout == "Admit"
    assert spec.health.restart_budget.max_restarts == 5
    assert spec.rollout.max_unavailable == 1
    assert validate_cluster(manifest()) == []


def test_json_names_are_camel_case_with_kubernetes_acronyms() -> None:
    assert camel("gpu_memory_utilization") == "gpuMemoryUtilization"
    assert camel("kv_bytes_per_token_per_gpu") == "kvBytesPerTokenPerGPU"
    assert camel("gpus_per_replica") == "gpusPerReplica"
    assert camel("api_key_secret") == "apiKeySecret"
    spec = VLLMClusterSpec.model_validate(
        {"model": {"name": "m"}, "parallelism": {"decodeContext": 2, "tensor": 4}}
    )
    dumped: dict[str, Any] = spec.to_json()
    assert dumped["parallelism"] == {"tensor": 4, "pipeline": 1, "decodeContext": 2}
    assert dumped["router"]["thresholds"]["qNorm"] == 20
    assert "servedName" not in dumped["model"]  # unset optional fields are left out


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("79.6Gi", Fraction("79.6") * 2**30),
        ("512M", 512 * 10**6),
        ("1e9", 10**9),
        ("1.5Ki", 1536),
        ("100m", Fraction(1, 10)),
        ("1024", 1024),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["80GB", "-1Gi", "Gi", "1.5.0", "1e0.5"])
def test_malformed_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_a_quantity_may_be_written_as_a_number() -> None:
    spec = VLLMClusterSpec.model_validate({"model": {"name": "m"}, "gpu": {"memory": 85899345920}})
    assert spec.gpu.memory == "85899345920"
    assert parse_quantity(spec.gpu.memory) == 80 * 2**30


def test_errors_name_the_field_in_json_form() -> None:
    errors = validate_cluster(manifest(engine={"gpuMemoryUtilization": 0}, replicas=-2))
    assert sorted(error.field for error in errors) == [
        "spec.engine.gpuMemoryUtilization",
        "spec.replicas",
    ]
    assert str(errors[0]).startswith(errors[0].field + ": ")


def test_a_map_key_is_named_in_brackets_and_a_bad_key_by_its_map() -> None:
    # As the API server names them in its CEL rules' errors; a key may hold dots.
    labels = {"example.com/team": "a b", "cost center": "ml"}
    errors = validate_cluster(manifest(engine={"pod": {"labels": labels}}))
    assert sorted((e.field, e.message.split(" must ")[0]) for e in errors) == [
        ("spec.engine.pod.labels", "key 'cost center'"),
        ("spec.engine.pod.labels[example.com/team]", "'a b'"),
    ]


def test_a_field_left_empty_is_absent_as_the_api_server_prunes_it() -> None:
    given = manifest(replicas=None, engine={"resources": {"limits": None}}, router=None)
    assert validate_cluster(given) == []
    spec = VLLMCluster.model_validate(given).spec
    assert spec.replicas == 1 and spec.engine.resources is not None
    assert spec.engine.resources.limits == {}


def test_a_misspelt_field_is_an_error_not_ignored() -> None:
    [error] = validate_cluster(manifest(router={"polcy": "random"}))
    assert error.field == "spec.router.polcy"
    assert "unknown field" in error.message


def test_cross_field_errors_name_the_field_and_the_fix() -> None:
    errors = validate_cluster(
        manifest(engine={"extraArgs": ["-tp", "4", "--max-model-len=4096", "--enforce-eager"]})
    )
    assert [(e.field, e.message) for e in errors] == [
        (
            "spec.engine.extraArgs",
            "-tp sets vLLM's tensor_parallel_size, which shoal sets: use "
            "spec.parallelism.tensor instead",
        ),
        (
            "spec.engine.extraArgs",
            "--max-model-len=4096 sets vLLM's max_model_len, which shoal sets: use "
            "spec.engine.maxModelLen instead",
        ),
    ]


def test_heads_come_from_the_architecture_fields_over_the_preset() -> None:
    # A preset with an override: the override's KV heads decide the DCP rules.
    errors = validate_cluster(
        manifest(
            model={
                "name": "example/llama-variant",
                "architecture": {"preset": "Llama-3.1-70B", "kvHeads": 4},
            },
            parallelism={"tensor": 8, "decodeContext": 2},
            engine={"maxModelLen": 8192},
        )
    )
    assert errors == []


def test_status_embeds_the_planners_output() -> None:
    spec = VLLMClusterSpec.model_validate(
        {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "parallelism": {"tensor": 8}}
    )
    capacity = plan_spec(spec)
    assert capacity is not None
    status = VLLMClusterStatus(
        replicas=1, capacity=CapacityStatus(**capacity.model_dump(), measured=[])
    )
    dumped: dict[str, Any] = status.to_json()
    assert dumped["capacity"]["kvTokensPerReplica"] == capacity.kv_tokens_per_replica
    assert dumped["capacity"]["weightBytesPerGPU"] == capacity.weight_bytes_per_gpu
    cluster = VLLMCluster.model_validate({"spec": spec.to_json(), "status": dumped})
    assert cluster.status is not None and cluster.status.capacity == status.capacity
