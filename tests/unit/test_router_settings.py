"""The router's settings are defined once (`api.router.RouterSettings`): the
router.json the operator writes for a VLLMCluster with an empty spec.router is
the router's own defaults, every setting can be set from the resource and is
explained by `kubectl explain`, and a local fleet's router (demo, bench) runs
on what the operator would deploy."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from shoal.api.crd import crd
from shoal.api.router import RouterPolicy, RouterSettings
from shoal.bench.deployed import fleet_router_config, scrape_timing
from shoal.bench.local import FleetSpec
from shoal.controller.router import router_config
from shoal.router.config import RouterConfig
from tests.unit.controller_samples import spec_of


def test_an_empty_spec_router_gives_the_routers_own_defaults() -> None:
    assert router_config(spec_of()) == RouterConfig()


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted JSON names of every setting, nested models expanded."""
    names = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += _leaf_fields(annotation, f"{prefix}{alias}.")
        else:
            names.append(prefix + alias)
    return names


def _schema_at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def test_every_router_setting_is_in_the_crd_with_an_explanation() -> None:
    router = _schema_at(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "spec.router")
    names = _leaf_fields(RouterSettings)
    # cache-aware's own knobs, which could not be set from a VLLMCluster before.
    for knob in (
        "loadTokens",
        "tieTolerance",
        "boundedLoadMinRequests",
        "charsPerToken",
        "hitWeight",
    ):
        assert f"thresholds.{knob}" in names
    for dotted in names:
        assert _schema_at(router, dotted).get("description"), dotted


def test_router_json_carries_only_what_the_resource_or_the_process_decides() -> None:
    extra = set(RouterConfig.model_fields) - set(RouterSettings.model_fields)
    assert extra == {"max_num_seqs", "api_key_file", "engine_key_file", "internal_port"}


def test_the_policy_of_spec_router_is_the_routers_enum() -> None:
    assert router_config(spec_of(router={"policy": "prefix"})).policy is RouterPolicy.PREFIX
    with pytest.raises(ValidationError, match="cache-aware"):
        RouterConfig.model_validate({"policy": "fastest"})


def test_scrape_timeout_and_staleness_follow_the_interval_unless_set() -> None:
    fast = RouterConfig()
    assert (fast.scrape_timeout_seconds, fast.stale_after_seconds) == (0.2, 2.0)
    slow = RouterConfig.model_validate({"scrapeIntervalMilliseconds": 1000})
    assert (slow.scrape_timeout_seconds, slow.stale_after_seconds) == (0.8, 8.0)
    fixed = RouterConfig.model_validate(
        {"scrapeTimeoutMilliseconds": 5000, "staleAfterMilliseconds": 60000}
    )
    assert (fixed.scrape_timeout_seconds, fixed.stale_after_seconds) == (5.0, 60.0)


def test_a_local_fleets_router_runs_on_what_the_operator_would_write() -> None:
    fleet = FleetSpec(replicas=4, profile="h100-llama3-8b")
    written = fleet_router_config(fleet, policy=RouterPolicy.CACHE_AWARE)
    deployed = router_config(
        spec_of(engine={"maxNumSeqs": 256}, router={"policy": "cache-aware"})
    ).model_dump(mode="json", by_alias=True)
    assert written == deployed
    assert RouterConfig.model_validate(written) == RouterConfig()


def test_a_fleet_at_quarter_speed_scrapes_four_times_less_often_in_real_time() -> None:
    assert scrape_timing(1.0) == {}, "real time keeps the defaults"
    fleet = FleetSpec(replicas=2, time_scale=0.25)
    config = RouterConfig.model_validate(
        fleet_router_config(fleet, policy=RouterPolicy.ROUND_ROBIN)
    )
    assert config.scrape_interval_seconds == pytest.approx(1.0)
    assert config.scrape_timeout_seconds == pytest.approx(0.8)
    assert config.stale_after_seconds == pytest.approx(8.0)
    # Settings asked for win over the scaling.
    asked = fleet_router_config(
        fleet, policy=RouterPolicy.ROUND_ROBIN, router={"scrapeIntervalMilliseconds": 100}
    )
    assert asked["scrapeIntervalMilliseconds"] == 100
