"""Self-healing on the testbed: a hung engine (its /health still 200) is
taken out of rotation, its group restarted, and it rejoins after warm-up
(the time from the fault to out-of-rotation and back in is printed); the
restart budget stops a replica that keeps hanging; pods of a lost node are
recreated on another."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    WARMED,
    cluster,
    cluster_manifest,
    condition_of,
    events,
    router_url,
    wait_ready,
)
from tests.e2e.test_warmup_gating import PROMPTS, SteadyLoad

pytestmark = pytest.mark.e2e

PATTERN = "shoal-heal"
# Checks every second, a canary deadline of one second, two misses in a row.
FAST_HEALTH = {
    "periodSeconds": 1,
    "canaryTimeoutSeconds": 1,
    "failureThreshold": 2,
    "restartBackoff": {"initialSeconds": 1, "maxSeconds": 2},
}


def _pod(bed: Testbed, ns: str, name: str) -> dict[str, Any] | None:
    found = get_json(bed, "pods", "-n", ns, "-o", "json")
    return next((p for p in found["items"] if p["metadata"]["name"] == name), None)


def _engine_args(*extra: str) -> dict[str, Any]:
    return {"maxModelLen": 8192, "extraArgs": ["--sim-time-scale", "50", *extra]}


def test_a_hung_replica_leaves_rotation_is_restarted_and_rejoins_after_warm_up(
    testbed: Testbed, ns: str
) -> None:
    manifest = cluster_manifest(
        "heal",
        replicas=2,
        engine=_engine_args("--sim-fault-api"),
        warmup={"prompts": PROMPTS, "timeoutSeconds": 30},
        health=FAST_HEALTH,
    )
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "heal", 2)
    url = router_url(testbed, ns, "heal")
    before = _pod(testbed, ns, "heal-r1-0")
    assert before is not None
    old_uid = before["metadata"]["uid"]
    engine = f"http://{before['status']['podIP']}:8000"
    with SteadyLoad(url) as load:
        wait_for(lambda: len(load.routed) >= 5, what="steady load flowing", timeout=30)
        httpx.post(engine + "/_sim/fault", json={"hang": True}, timeout=5).raise_for_status()
        fault_at = time.monotonic()

        def out_of_rotation() -> bool:
            pod = _pod(testbed, ns, "heal-r1-0")
            return (
                pod is None
                or pod["metadata"]["uid"] != old_uid
                or condition_of(pod, WARMED).get("status") == "False"
                or condition_of(pod, "Ready").get("status") != "True"
            )

        wait_for(out_of_rotation, what="heal-r1-0 out of rotation", timeout=30, interval=0.1)
        out_at = time.monotonic()

        def back() -> dict[str, Any] | None:
            pod = _pod(testbed, ns, "heal-r1-0")
            if pod is None or pod["metadata"]["uid"] == old_uid:
                return None
            ready = condition_of(pod, "Ready").get("status") == "True"
            return pod if ready else None

        pod = wait_for(back, what="a new heal-r1-0 Ready", timeout=90, interval=0.2)
        back_at = time.monotonic()
        wait_for(
            lambda: any(r == "heal-r1-0" and t > time.time() - 5 for t, r in load.routed[-50:]),
            what="routed requests on the restarted replica",
            timeout=30,
        )
    print(
        f"\nhang -> out of rotation {out_at - fault_at:.1f}s, "
        f"-> back in rotation {back_at - fault_at:.1f}s; {len(load.routed)} requests served, "
        f"{len(load.failed)} failed"
    )
    assert condition_of(pod, WARMED)["reason"] == "Warmed"
    wait_ready(testbed, ns, "heal", 2)
    status = cluster(testbed, ns, "heal")["status"]
    entry = next(r for r in status["replicaStatuses"] if r["index"] == 1)
    assert entry["restarts"] == 1
    assert entry["lastRestartReason"].startswith("EngineHung")
    assert next(r for r in status["replicaStatuses"] if r["index"] == 0)["restarts"] == 0
    assert "ReplicaRestarted" in [e["reason"] for e in events(testbed, ns, "heal")]
    # Only requests already on the hung engine may have failed.
    assert len(load.failed) <= 2, load.failed


def test_the_restart_budget_stops_a_replica_that_keeps_hanging(testbed: Testbed, ns: str) -> None:
    # Every engine hangs a second (of simulated time) after it starts.
    manifest = cluster_manifest(
        "budget",
        replicas=1,
        engine=_engine_args("--sim-hang-after", "1"),
        health={**FAST_HEALTH, "restartBudget": {"maxRestarts": 2, "windowSeconds": 600}},
    )
    apply(testbed, ns, manifest)

    def degraded() -> dict[str, Any] | None:
        status = cluster(testbed, ns, "budget").get("status", {})
        found = {c["type"]: c for c in status.get("conditions", [])}.get("Degraded", {})
        return status if found.get("status") == "True" else None

    status = wait_for(degraded, what="budget Degraded", timeout=120, interval=0.5)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Degraded"]["reason"] == "RestartBudgetExhausted"
    [entry] = status["replicaStatuses"]
    assert entry["restarts"] == 2 and entry["state"] == "Unhealthy"
    # No more restarts: the same pod stays, out of rotation.
    pod = _pod(testbed, ns, "budget-r0-0")
    assert pod is not None
    uid = pod["metadata"]["uid"]
    time.sleep(5)
    pod = _pod(testbed, ns, "budget-r0-0")
    assert pod is not None and pod["metadata"]["uid"] == uid
    assert condition_of(pod, WARMED)["status"] == "False"
    assert condition_of(pod, "Ready")["status"] == "False"
    reasons = [e["reason"] for e in events(testbed, ns, "budget")]
    assert reasons.count("ReplicaRestarted") == 2
    assert reasons.count("RestartBudgetExhausted") == 1


def _set_node_ready(bed: Testbed, node: str, status: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady" if status == "True" else "ShoalTestNodeLost",
        "message": "set by a shoal e2e test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    patch = json.dumps({"status": {"conditions": [condition]}})
    bed.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch)


def test_engine_pods_on_a_node_lost_for_node_loss_seconds_are_recreated_elsewhere(
    testbed: Testbed, ns: str
) -> None:
    manifest = cluster_manifest(
        "lost", replicas=2, engine=_engine_args(), health={**FAST_HEALTH, "nodeLossSeconds": 3}
    )
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "lost", 2)
    before = _pod(testbed, ns, "lost-r1-0")
    assert before is not None
    node, old_uid = before["spec"]["nodeName"], before["metadata"]["uid"]
    # kwok stops heartbeating a node without its annotation: it stays NotReady.
    testbed.kubectl("annotate", "node", node, "kwok.x-k8s.io/node-")
    try:
        _set_node_ready(testbed, node, "False")
        lost_at = time.monotonic()

        def recreated() -> dict[str, Any] | None:
            pod = _pod(testbed, ns, "lost-r1-0")
            if pod is None or pod["metadata"]["uid"] == old_uid:
                return None
            ready = condition_of(pod, "Ready").get("status") == "True"
            return pod if ready and pod["spec"].get("nodeName") else None

        pod = wait_for(recreated, what="lost-r1-0 recreated and Ready", timeout=90, interval=0.5)
        print(f"\nnode NotReady -> replica Ready elsewhere in {time.monotonic() - lost_at:.1f}s")
        assert pod["spec"]["nodeName"] != node
        reasons = [e["reason"] for e in events(testbed, ns, "lost")]
        assert "NodeLost" in reasons
    finally:
        testbed.kubectl("annotate", "node", node, "kwok.x-k8s.io/node=fake", "--overwrite")
        _set_node_ready(testbed, node, "True")
    wait_ready(testbed, ns, "lost", 2)
