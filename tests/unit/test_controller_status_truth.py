"""Status describes the fleet that runs, in the cases where it used to
contradict it (issue 18, finding 5): an invalid spec (SpecValid=False)
describes the replicas that run, not those the invalid spec would need; no
router is not Ready "behind the router"."""

from __future__ import annotations

from shoal.api.validation import validate_spec
from shoal.controller.observe import Observed, ReplicaFacts
from shoal.controller.status import build_status
from tests.unit.controller_samples import spec_of
from tests.unit.test_controller_decide import pod_for, set_for
from tests.unit.test_controller_status import conditions, inputs, two_serving


def test_an_invalid_edit_of_nodes_per_replica_still_counts_the_replicas_serving() -> None:
    # Tensor 16 over 8-GPU nodes: two pods per replica, while one-pod replicas serve.
    spec = spec_of(replicas=3, parallelism={"tensor": 16}, engine={"extraArgs": ["-tp", "2"]})
    errors = validate_spec(spec)
    assert errors
    status = build_status(inputs(two_serving(), spec=spec, errors=errors))
    assert status["readyReplicas"] == 2 and status["warmReplicas"] == 2
    assert [r["index"] for r in status["replicaStatuses"]] == [0, 1]
    assert {r["state"] for r in status["replicaStatuses"]} == {"Serving"}


def test_an_invalid_spec_lists_no_replica_that_does_not_exist() -> None:
    spec = spec_of(replicas=1, engine={"extraArgs": ["--model", "x"]})
    errors = validate_spec(spec)
    assert errors
    status = build_status(inputs(Observed(replicas={}, router=None), spec=spec, errors=errors))
    assert status["replicaStatuses"] == []


def test_without_a_router_ready_does_not_say_behind_the_router() -> None:
    spec = spec_of(replicas=2, parallelism={"tensor": 4}, router={"replicas": 0})
    observed = Observed(
        replicas={
            i: ReplicaFacts(index=i, leader=set_for(i, None), pods=[pod_for(i)]) for i in (0, 1)
        },
        router=None,
    )
    ready = conditions(build_status(inputs(observed, spec=spec)))["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "NoRouter"
    assert "spec.router.replicas is 0" in ready["message"]
