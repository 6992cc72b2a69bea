"""Specs and fleets for the controller's unit tests."""

from __future__ import annotations

from typing import Any

from shoal.api.resource import VLLMCluster
from shoal.api.spec import VLLMClusterSpec
from shoal.controller.desired import DesiredFleet, desired_fleet
from shoal.controller.identity import ClusterRef

REF = ClusterRef(name="c", namespace="ns", uid="00000000-0000-0000-0000-000000000001")
ROUTER_IMAGE = "ghcr.io/shoal-dev/shoal:test"


def spec_of(**fields: Any) -> VLLMClusterSpec:
    base: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "engine": {"maxModelLen": 8192},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return VLLMCluster.model_validate({"spec": base}).spec


def fleet_of(spec: VLLMClusterSpec) -> DesiredFleet:
    return desired_fleet(REF, spec, router_image=ROUTER_IMAGE)


MODEL = "meta-llama/Llama-3.1-70B-Instruct"
TOKEN = {"tokenSecret": {"name": "hf"}}
# Specs that make shoal set each engine variable (api.engine_env), or not.
ENV_SPECS: dict[str, dict[str, Any]] = {
    "hub": {},
    "hub-token": {"model": {"name": MODEL, "source": {"hf": TOKEN}}},
    "pvc": {"model": {"name": MODEL, "source": {"pvc": {"claimName": "weights"}}}},
    "shared-cache": {"model": {"name": MODEL, "source": {"hf": TOKEN}, "cache": {"shared": {}}}},
    "node-cache": {"model": {"name": MODEL, "cache": {"node": {}}}},
    "api-key": {"engine": {"apiKeySecret": {"name": "k"}}},
    "multi-node": {"parallelism": {"tensor": 8, "pipeline": 2}},
}


def env_spec(name: str, env: list[dict[str, Any]] | None = None) -> VLLMClusterSpec:
    """ENV_SPECS[name], with this engine env."""
    fields = {"parallelism": {"tensor": 8}, **ENV_SPECS[name]}  # 70B fits on 8 GPUs
    if env is not None:
        fields["engine"] = {**fields.get("engine", {}), "env": env}
    return spec_of(**fields)
