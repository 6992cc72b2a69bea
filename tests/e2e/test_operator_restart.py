"""An operator that dies mid-reconcile (SIGKILLed from outside once the API
server shows its first engine StatefulSet, while a quota holds back the
rest) and starts again converges: the fleet completes, nothing is created
twice, and what existed is kept, not replaced. A restarted operator also
keeps a spent restart budget."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, namespace, wait_for
from tests.e2e.operator_env import (
    children,
    cluster_manifest,
    delete_clusters,
    install_crd,
    names,
    operator,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-rs"


# One StatefulSet per namespace: the operator's pass creates the first engine
# StatefulSet and is refused the second, before the router's Deployment, so
# the kill lands at the same point of the reconcile on every run.
ONE_STATEFULSET = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "one-statefulset"},
    "spec": {"hard": {"count/statefulsets.apps": "1"}},
}


def test_an_operator_killed_after_the_first_statefulset_converges_without_duplicates(
    testbed: Testbed, tmp_path: Path
) -> None:
    install_crd(testbed)
    log = tmp_path / "operator.log"
    with namespace(testbed, PATTERN) as ns:
        try:
            apply(testbed, ns, ONE_STATEFULSET)
            # The API server refuses every create the quota covers until the
            # quota controller has counted what exists.
            wait_for(
                lambda: (
                    get_json(testbed, "resourcequota", "one-statefulset", "-n", ns)
                    .get("status", {})
                    .get("hard")
                ),
                what="the quota counted",
            )
            with operator(testbed, log, namespaces=[f"{PATTERN}-*"]) as first:
                apply(testbed, ns, cluster_manifest("fleet", replicas=3, tensor=4))
                wait_for(
                    lambda: children(testbed, ns, "fleet", "statefulsets"),
                    what="the first engine StatefulSet applied",
                )
                first.kill()
            assert names(children(testbed, ns, "fleet", "statefulsets")) == ["fleet-r0"]
            # A refused write no longer ends the pass (it becomes a condition), so
            # the router may exist already: at most the one.
            assert names(children(testbed, ns, "fleet", "deployments")) in ([], ["fleet-router"])
            first_uid = get_json(testbed, "statefulset", "fleet-r0", "-n", ns)["metadata"]["uid"]
            testbed.kubectl("delete", "resourcequota", "one-statefulset", "-n", ns)

            with operator(testbed, log, namespaces=[f"{PATTERN}-*"]):
                wait_ready(testbed, ns, "fleet", 3)
                assert names(children(testbed, ns, "fleet", "statefulsets")) == [
                    "fleet-r0",
                    "fleet-r1",
                    "fleet-r2",
                ]
                assert (
                    get_json(testbed, "statefulset", "fleet-r0", "-n", ns)["metadata"]["uid"]
                    == first_uid
                )
                pods = children(testbed, ns, "fleet", "pods")
                engines = [
                    p
                    for p in pods
                    if p["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
                ]
                assert names(engines) == ["fleet-r0-0", "fleet-r1-0", "fleet-r2-0"]
                assert len(pods) == 5  # and spec.router.replicas' default of two router pods
                replicasets = get_json(testbed, "replicasets", "-n", ns)["items"]
                assert len(replicasets) == 1
                delete_clusters(testbed, ns)
        finally:
            delete_clusters(testbed, ns)


def test_a_restarted_operator_keeps_a_spent_restart_budget(
    testbed: Testbed, tmp_path: Path
) -> None:
    """The budget's history lives in the status, not only in the operator's
    memory: a new operator process must not restart a replica that the old
    one gave up on (that is how an operator crash-loops a fleet)."""
    from shoal.controller.names import CONDITION_WARMED
    from tests.e2e.operator_env import condition_of, events
    from tests.e2e.test_self_healing import FAST_HEALTH, _engine_args, _pod

    install_crd(testbed)
    log = tmp_path / "operator.log"
    health = {**FAST_HEALTH, "restartBudget": {"maxRestarts": 2, "windowSeconds": 600}}
    manifest = cluster_manifest(
        "spent", replicas=1, engine=_engine_args("--sim-hang-after", "1"), health=health
    )

    def entry() -> dict[str, Any]:
        status = get_json(testbed, "vllmcluster", "spent", "-n", ns).get("status", {})
        found: list[dict[str, Any]] = status.get("replicaStatuses") or [{}]
        return found[0]

    def admissions() -> int:
        found = events(testbed, ns, "spent")
        return sum(e.get("count") or 1 for e in found if e["reason"] == "ReplicaAdmitted")

    with namespace(testbed, PATTERN) as ns:
        try:
            with operator(testbed, log, namespaces=[f"{PATTERN}-*"]):
                apply(testbed, ns, manifest)
                wait_for(
                    lambda: entry().get("restarts") == 2 and entry().get("state") == "Unhealthy",
                    what="restart budget spent",
                    timeout=120,
                    interval=0.5,
                )
            assert len(entry()["recentRestartTimes"]) == 2
            pod = _pod(testbed, ns, "spent-r0-0")
            assert pod is not None
            uid = pod["metadata"]["uid"]
            admitted = admissions()
            with operator(testbed, log, namespaces=[f"{PATTERN}-*"]):
                # Several health periods, each of which finds the engine hung.
                time.sleep(10)
                pod = _pod(testbed, ns, "spent-r0-0")
                assert pod is not None and pod["metadata"]["uid"] == uid
                assert entry()["restarts"] == 2
                # Kept out of rotation throughout: the new operator reads why
                # from its gate. Before, its /health answered, so it was
                # admitted again as new, took traffic, and was found hung again.
                assert admissions() == admitted
                gate = condition_of(pod, CONDITION_WARMED)
                assert (gate["status"], gate["reason"]) == ("False", "EngineHung"), gate
                delete_clusters(testbed, ns)
        finally:
            delete_clusters(testbed, ns)


def test_a_restarted_operator_leaves_an_idle_fleet_at_zero_and_clears_a_gone_hpa(
    testbed: Testbed, tmp_path: Path
) -> None:
    """Before: a new operator knew no last request, so it started a replica
    of every fleet at zero (and held it for idleSeconds); and it never
    nulled stoodAsideFor, which only the process before it had written."""
    from shoal.controller.autoscaler import PERIOD_SECONDS as AUTOSCALE_PERIOD
    from tests.e2e.test_autoscaling import autoscaling_status, hpa_for

    install_crd(testbed)
    log = tmp_path / "operator.log"
    at_zero = {"minReplicas": 0, "maxReplicas": 2, "targetPerReplica": 2, "idleSeconds": 600}
    aside = {"minReplicas": 1, "maxReplicas": 3, "targetPerReplica": 2}

    with namespace(testbed, PATTERN) as ns:
        try:
            held = {"queue": {"zeroReplicaWaitSeconds": 120}}
            apply(
                testbed,
                ns,
                cluster_manifest("idle", replicas=0, autoscaling=at_zero, router=held),
            )
            apply(testbed, ns, cluster_manifest("aside", replicas=1, autoscaling=aside))
            apply(testbed, ns, hpa_for("aside"))
            for _ in range(2):
                with operator(testbed, log, namespaces=[f"{PATTERN}-*"]):
                    wait_for(
                        lambda: autoscaling_status(testbed, ns, "aside").get("stoodAsideFor"),
                        what="status.autoscaling naming the HPA",
                        timeout=30,
                    )
                    # Rounds enough for a first round's scale-up to show.
                    wait_for(
                        lambda: autoscaling_status(testbed, ns, "idle").get("routers") == 2,
                        what="both routers of the fleet at zero read",
                        timeout=60,
                    )
                    time.sleep(4 * AUTOSCALE_PERIOD)
                    spec = get_json(testbed, "vllmcluster", "idle", "-n", ns)["spec"]
                    assert spec["replicas"] == 0, autoscaling_status(testbed, ns, "idle")
            with operator(testbed, log, namespaces=[f"{PATTERN}-*"]):
                testbed.kubectl("delete", "hpa", "aside-hpa", "-n", ns)
                wait_for(
                    lambda: "stoodAsideFor" not in autoscaling_status(testbed, ns, "aside"),
                    what="stoodAsideFor gone once the HPA is, after a restart",
                    timeout=30,
                )
                delete_clusters(testbed, ns)
        finally:
            delete_clusters(testbed, ns)
