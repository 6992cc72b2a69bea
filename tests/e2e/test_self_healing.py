"""Self-healing on the testbed: a hung engine (its /health still 200) is
taken out of rotation, its group restarted, and it rejoins after warm-up
(the time from the fault to out-of-rotation and back in is printed); the
restart budget stops a replica that keeps hanging; replicas that all fail at
once on connection-level errors are left alone and serving, the cluster
Degraded; a replica whose requests fail through the router (read from the
router's metrics) is restarted for it; pods of a lost node are recreated on
another."""

from __future__ import annotations

import contextlib
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
    complete,
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
    assert condition_of(pod, WARMED)["reason"] == "Warmed", condition_of(pod, WARMED)
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


def _degraded(bed: Testbed, ns: str, name: str) -> dict[str, Any]:
    status = cluster(bed, ns, name).get("status", {})
    found: dict[str, Any] = {c["type"]: c for c in status.get("conditions", [])}.get("Degraded", {})
    return found


@pytest.mark.parametrize("cut", ["reset", "silent"])
def test_replicas_failing_at_once_on_connection_errors_are_left_serving_and_degraded(
    testbed: Testbed, ns: str, cut: str
) -> None:
    manifest = cluster_manifest(
        "cutoff", replicas=2, engine=_engine_args("--sim-fault-api"), health=FAST_HEALTH
    )
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "cutoff", 2)
    url = router_url(testbed, ns, "cutoff")
    names = ["cutoff-r0-0", "cutoff-r1-0"]
    pods = [_pod(testbed, ns, name) for name in names]
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if p is not None}
    engines = [f"http://{p['status']['podIP']}:8000" for p in pods if p is not None]
    assert len(uids) == len(engines) == 2
    # Every connection to both engines is reset, or goes unanswered (packets
    # dropped): what the operator sees when it, not the engines, is cut off
    # from them. Before, unanswered ones took every replica out of rotation
    # and restarted one. Half a check period apart,
    # as a partition reaches connections: the first replica reaches
    # failureThreshold a check before the second and must not be restarted.
    fault_at = time.monotonic()
    for engine in engines:
        httpx.post(engine + "/_sim/fault", json={"connections": cut}, timeout=5)
        time.sleep(0.5)
    try:
        with pytest.raises(httpx.TransportError):
            httpx.get(engines[0] + "/health", timeout=5)
        degraded = wait_for(
            lambda: (d := _degraded(testbed, ns, "cutoff")).get("status") == "True" and d,
            what="cutoff Degraded",
            timeout=30,
            interval=0.2,
        )
        degraded_after = time.monotonic() - fault_at
        assert degraded["reason"] == "ManyReplicasUnreachable", degraded
        assert "replicas 0, 1 fail at once on connection-level errors" in degraded["message"]
        # Several more checks (a second each, two failures in a row to act):
        # neither replica is restarted or taken out of rotation.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            for name in names:
                pod = _pod(testbed, ns, name)
                assert pod is not None and pod["metadata"]["uid"] == uids[name], name
                assert condition_of(pod, WARMED)["status"] == "True", name
                assert condition_of(pod, "Ready")["status"] == "True", name
            time.sleep(0.5)
        assert _degraded(testbed, ns, "cutoff")["reason"] == "ManyReplicasUnreachable"
    finally:
        # The network comes back to them half a check apart too: the last to
        # answer again fails alone for a check, past failureThreshold, and
        # must not be restarted for the outage (seen in CI).
        # An engine restarted against the rule refuses this; the uid check
        # below then says what went wrong.
        for engine in engines:
            with contextlib.suppress(httpx.TransportError):
                httpx.post(engine + "/_sim/fault", json={"connections": "ok"}, timeout=5)
            time.sleep(0.5)
    # The network is back: the same engines serve through the router again and
    # the cluster is no longer Degraded, with no restart at all.
    wait_for(
        lambda: complete(url, "after the cut").status_code == 200,
        what="requests through the router",
        timeout=30,
    )
    wait_for(
        lambda: _degraded(testbed, ns, "cutoff").get("status") == "False",
        what="cutoff no longer Degraded",
        timeout=30,
        interval=0.2,
    )
    print(f"\nboth replicas cut off -> Degraded (ManyReplicasUnreachable) {degraded_after:.1f}s")
    for name in names:
        pod = _pod(testbed, ns, name)
        assert pod is not None and pod["metadata"]["uid"] == uids[name]
    status = cluster(testbed, ns, "cutoff")["status"]
    assert [r["restarts"] for r in status["replicaStatuses"]] == [0, 0]
    reasons = [e["reason"] for e in events(testbed, ns, "cutoff")]
    assert reasons.count("ManyReplicasUnreachable") == 1
    assert "ReplicaRestarted" not in reasons


def test_a_replica_failing_requests_through_the_router_is_restarted_for_it(
    testbed: Testbed, ns: str
) -> None:
    # The canary fails too, at the same rate: three failed checks in a row on
    # the canary alone would take 0.5^3 luck, while the router sees ~half of
    # the replica's requests fail every check.
    health = {
        **FAST_HEALTH,
        "failureThreshold": 3,
        "routerErrors": {"threshold": 0.25, "minRequests": 10},
    }
    # Round-robin keeps sending the failing replica its share: the load-scoring
    # policies add a replica's recent error rate to its load and starve it of
    # routed requests (clients lose none, 5xx are retried elsewhere), which
    # would leave only the canary to notice it.
    manifest = cluster_manifest(
        "errors",
        replicas=2,
        engine=_engine_args("--sim-fault-api"),
        health=health,
        router={"policy": "round-robin"},
    )
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "errors", 2)
    url = router_url(testbed, ns, "errors")
    before = _pod(testbed, ns, "errors-r1-0")
    assert before is not None
    old_uid = before["metadata"]["uid"]
    engine = f"http://{before['status']['podIP']}:8000"
    with SteadyLoad(url, pause=0.02) as load:
        wait_for(lambda: len(load.routed) >= 10, what="steady load flowing", timeout=30)
        httpx.post(engine + "/_sim/fault", json={"error_rate": 0.5}, timeout=5).raise_for_status()
        fault_at = time.monotonic()

        def restarted() -> dict[str, Any] | None:
            status = cluster(testbed, ns, "errors").get("status", {})
            entries = status.get("replicaStatuses") or []
            entry: dict[str, Any] = next((r for r in entries if r["index"] == 1), {})
            return entry if entry.get("restarts") else None

        entry = wait_for(restarted, what="errors-r1-0 restarted", timeout=60, interval=0.2)
        took = time.monotonic() - fault_at
    print(f"\n50% errors through the router -> restart {took:.1f}s: {entry['lastRestartReason']}")
    assert entry["lastRestartReason"].startswith("RequestsFailing")
    assert "of routed requests failed" in entry["lastRestartReason"]
    assert "answered 5xx through the router" in entry["lastRestartReason"]
    wait_for(
        lambda: (
            (p := _pod(testbed, ns, "errors-r1-0")) is not None and p["metadata"]["uid"] != old_uid
        ),
        what="a new errors-r1-0",
        timeout=30,
    )
    wait_ready(testbed, ns, "errors", 2)
    status = cluster(testbed, ns, "errors")["status"]
    assert next(r for r in status["replicaStatuses"] if r["index"] == 0)["restarts"] == 0


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
