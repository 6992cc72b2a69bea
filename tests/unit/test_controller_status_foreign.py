"""The reconciler's status writes leave the autoscaler's field alone: a pass
neither nulls status.autoscaling nor writes because only it differs."""

from __future__ import annotations

from shoal.controller.status import status_patch

AUTOSCALING = {"desiredReplicas": 3, "lastDecision": "ScaledUp"}


def test_a_pass_does_not_null_the_autoscalers_status() -> None:
    previous = {"replicas": 2, "autoscaling": AUTOSCALING}
    patch = status_patch(previous, {"replicas": 3})
    assert patch == {"replicas": 3}


def test_a_pass_with_nothing_new_of_its_own_writes_nothing() -> None:
    assert status_patch({"replicas": 2, "autoscaling": AUTOSCALING}, {"replicas": 2}) is None
