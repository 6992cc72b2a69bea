"""Autoscaling specs that cannot work are refused by `shoal plan -f` (Python)
and at admission (CEL) for the same rule: a fleet that may go to zero needs
routers that hold a request at zero (zeroReplicaWaitSeconds) and a queue to
hold it in (maxQueued), or no request ever counts as demand and nothing
scales it up again."""

from __future__ import annotations

from typing import Any

from shoal.api.cel import RULES
from shoal.api.crd import crd
from shoal.api.validation import validate_spec
from tests.unit.controller_samples import spec_of

SPEC = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def errors_of(*, min_replicas: int, queue: dict[str, Any]) -> list[tuple[str, str, str]]:
    spec = spec_of(
        model={"name": "meta-llama/Llama-3.1-8B-Instruct"},
        autoscaling={"minReplicas": min_replicas, "maxReplicas": 4},
        router={"queue": queue},
    )
    return [(e.field, e.rule, e.message) for e in validate_spec(spec)]


def test_a_fleet_that_may_go_to_zero_with_no_queue_is_refused_naming_max_queued() -> None:
    [(field, rule, message)] = errors_of(
        min_replicas=0, queue={"zeroReplicaWaitSeconds": 120, "maxQueued": 0}
    )
    assert (field, rule) == ("spec.router.queue.maxQueued", "autoscaling-zero-queue")
    assert "429" in message and "raise spec.autoscaling.minReplicas" in message


def test_a_queue_of_one_or_a_fleet_that_keeps_a_replica_is_accepted() -> None:
    assert errors_of(min_replicas=0, queue={"zeroReplicaWaitSeconds": 120, "maxQueued": 1}) == []
    # With a replica always there, maxQueued 0 only refuses what a saturated fleet cannot take.
    assert errors_of(min_replicas=1, queue={"maxQueued": 0}) == []


def test_admission_refuses_it_too_by_the_rule_of_the_same_id() -> None:
    [rule] = [r for r in RULES if r.field_path == ".router.queue.maxQueued"]
    assert rule.rule == "autoscaling-zero-queue" and rule.location == ""
    assert "self.autoscaling.minReplicas > 0" in rule.expression
    assert "self.router.queue.maxQueued > 0" in rule.expression
    assert "spec.router.queue.maxQueued" in rule.message
    assert rule.schema() in SPEC["x-kubernetes-validations"]
