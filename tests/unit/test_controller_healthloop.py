"""The operator's health loop keeps one tracker per leader pod: an edit of
spec.health reaches the trackers of running pods, not only new ones."""

from __future__ import annotations

from shoal.api.spec import HealthSpec
from shoal.controller.healthloop import HealthChecks, Target, _ClusterChecks
from shoal.engine.client import EngineClient
from shoal.health.assess import Outcome, Probe

DEAD = Probe(at=0.0, health=Outcome.ERROR, health_status=500)


def test_a_health_spec_edit_reaches_a_running_pods_tracker() -> None:
    checks = HealthChecks(engine=EngineClient())
    cluster = _ClusterChecks(HealthSpec.model_validate({"failureThreshold": 5}), lambda: None)
    target = Target(ip="10.0.0.5", model="m", name="c-r0-0")
    checks._assess(cluster, "uid-0", target, DEAD, None)
    assert not cluster.latest["uid-0"].unhealthy  # 1 of 5

    cluster.health = HealthSpec.model_validate({"failureThreshold": 2})  # as update() sets it
    checks._assess(cluster, "uid-0", target, DEAD, None)
    latest = cluster.latest["uid-0"]
    assert (latest.consecutive, latest.threshold, latest.unhealthy) == (2, 2, True)
