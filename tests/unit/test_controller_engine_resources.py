"""Engine pods are never BestEffort: CPU and memory requests derived from the
model unless the spec sets them (docs/getting-started.md gives the rule):
CPU 2 per GPU of the pod plus 2; memory /dev/shm's size plus 4Gi plus the
pod's share of the weights (vLLM stages them through host memory), or 8Gi
per GPU when the model's size is unknown. No limits: a memory limit turns a
load's peak into an OOMKill."""

from __future__ import annotations

from typing import Any

from shoal.controller.engine import build_leader_statefulset, build_worker_statefulset
from tests.unit.controller_samples import REF, spec_of


def resources(spec: Any, *, worker: bool = False) -> dict[str, Any]:
    built = (
        build_worker_statefulset(REF, spec, index=0)
        if worker
        else build_leader_statefulset(REF, spec, index=0)
    )
    assert built is not None
    found: dict[str, Any] = built["spec"]["template"]["spec"]["containers"][0]["resources"]
    return found


def test_a_70b_tp4_engine_requests_cpu_and_memory_for_its_share_of_the_weights() -> None:
    found = resources(spec_of(parallelism={"tensor": 4}))
    # 70.6e9 bf16 parameters = 131.5 GiB, + 16Gi /dev/shm + 4Gi.
    assert found["requests"] == {"cpu": "10", "memory": "152Gi"}
    assert found["limits"] == {"nvidia.com/gpu": "4"}


def test_a_two_node_replica_requests_half_the_weights_on_each_pod() -> None:
    spec = spec_of(model={"name": "meta-llama/Llama-3.1-405B-Instruct"}, parallelism={"tensor": 16})
    for worker in (False, True):
        # 405.9e9 bf16 = 756 GiB over two pods, + 20Gi.
        assert resources(spec, worker=worker)["requests"] == {"cpu": "18", "memory": "399Gi"}


def test_a_model_of_unknown_size_requests_8gi_per_gpu() -> None:
    spec = spec_of(model={"name": "someone/private-model"}, parallelism={"tensor": 2})
    assert resources(spec)["requests"] == {"cpu": "6", "memory": "36Gi"}


def test_requests_the_spec_sets_are_kept_and_only_the_missing_one_is_derived() -> None:
    spec = spec_of(
        parallelism={"tensor": 4},
        engine={"resources": {"requests": {"cpu": "3"}, "limits": {"memory": "500Gi"}}},
    )
    found = resources(spec)
    assert found["requests"] == {"cpu": "3", "memory": "152Gi"}
    assert found["limits"] == {"memory": "500Gi", "nvidia.com/gpu": "4"}


def test_a_derived_request_never_exceeds_a_limit_the_spec_sets() -> None:
    # The API server refuses a container whose request is above its limit: the
    # StatefulSet would never be written. Capped at the limit, the request is what
    # Kubernetes itself gives a container with only a limit.
    spec = spec_of(
        parallelism={"tensor": 4},
        engine={"resources": {"limits": {"cpu": "2", "memory": "100Gi"}}},
    )
    found = resources(spec)
    assert found["requests"] == {"cpu": "2", "memory": "100Gi"}
    assert found["limits"] == {"cpu": "2", "memory": "100Gi", "nvidia.com/gpu": "4"}
