"""The router a local fleet gets is the router the operator would deploy.

A fleet of simulated engines stands for a VLLMCluster: its replicas, its
served model, its engines' maxNumSeqs (the simulator profile's) and a
`spec.router`. The router's `router.json` is what the operator writes for that
resource (`controller.router.router_config`), so `shoal demo`, `shoal bench
compare` and the router benchmarks measure the settings and defaults users
run. The one change is time: against engines at `time_scale` x real time, the
router scrapes that much more (or less) often, in engine time, so it sees the
same dynamics as in a real fleet. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.api.router import RouterPolicy, RouterSettings
from shoal.api.spec import VLLMClusterSpec
from shoal.bench.local import FleetSpec
from shoal.controller.router import router_config
from shoal.router.config import RouterConfig
from shoal.sim.profiles import PROFILES


def scrape_timing(time_scale: float) -> dict[str, int]:
    """spec.router's scrape interval in engine time (its timeout and staleness
    follow the interval by their own defaults); nothing at real time."""
    if time_scale == 1.0:
        return {}
    default = RouterSettings.model_fields["scrape_interval_milliseconds"].default
    return {"scrapeIntervalMilliseconds": round(default / time_scale)}


def fleet_cluster_spec(
    fleet: FleetSpec, *, policy: RouterPolicy, router: Mapping[str, Any] | None = None
) -> VLLMClusterSpec:
    """The VLLMCluster a local fleet stands for. `router` holds more spec.router
    fields (camelCase, as in the resource); they win over the time scaling."""
    return VLLMClusterSpec.model_validate(
        {
            "model": {"name": fleet.model},
            "replicas": fleet.replicas,
            "engine": {"maxNumSeqs": PROFILES[fleet.profile].max_num_seqs},
            "router": {**scrape_timing(fleet.time_scale), **(router or {}), "policy": policy},
        }
    )


def fleet_router_config(
    fleet: FleetSpec, *, policy: RouterPolicy, router: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """router.json as the operator writes it for the fleet's VLLMCluster (camelCase,
    every field)."""
    spec = fleet_cluster_spec(fleet, policy=policy, router=router)
    config: RouterConfig = router_config(spec)
    return config.model_dump(mode="json", by_alias=True)
