"""The operator on the real control plane: a VLLMCluster applied with kubectl
becomes GPU-pinned engine StatefulSets (simulators at the pod IPs) behind a
router pod that serves requests; it scales with drain, forms multi-node
groups that restart whole, rolls spec changes one replica at a time, keeps
running through an invalid edit, and leaves nothing behind when deleted."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    CHILD_KINDS,
    MODEL,
    WARMED,
    children,
    cluster,
    cluster_manifest,
    complete,
    condition_of,
    events,
    leader_pods,
    names,
    printed_columns,
    router_url,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-op"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def _node_products(bed: Testbed) -> dict[str, str]:
    nodes = get_json(bed, "nodes")["items"]
    return {
        n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product", "")
        for n in nodes
    }


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _operator_writes(bed: Testbed, ns: str, offset: int) -> list[str]:
    """Writes by the operator (its client and kopf's) in ns, from the audit log."""
    writes = []
    with open(bed.logs / "audit.log") as log:
        log.seek(offset)
        for line in log:
            entry = json.loads(line)
            agent = entry.get("userAgent", "")
            if entry.get("stage") != "ResponseComplete" or entry.get("verb") in (
                "get",
                "list",
                "watch",
            ):
                continue
            if entry.get("objectRef", {}).get("namespace") != ns:
                continue
            if agent.startswith(("shoal-operator", "kopf")):
                ref = entry["objectRef"]
                writes.append(f"{entry['verb']} {ref.get('resource')}/{ref.get('name')}")
    return writes


def test_a_vllmcluster_becomes_engines_and_a_router_that_serve_and_go_when_deleted(
    testbed: Testbed, ns: str
) -> None:
    apply(testbed, ns, cluster_manifest("llama", replicas=2, tensor=4))
    wait_ready(testbed, ns, "llama", 2)

    assert names(children(testbed, ns, "llama", "statefulsets")) == ["llama-r0", "llama-r1"]
    products = _node_products(testbed)
    pods = leader_pods(testbed, ns, "llama")
    assert len(pods) == 2
    for pod in pods:
        assert products[pod["spec"]["nodeName"]] == GPU_PRODUCT
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "4"
        assert condition_of(pod, WARMED)["status"] == "True"
    assert names(children(testbed, ns, "llama", "deployments")) == ["llama-router"]
    assert "llama-router" in names(children(testbed, ns, "llama", "services"))

    columns = printed_columns(testbed, ns, "llama")
    assert (columns["REPLICAS"], columns["READY"], columns["WARM"], columns["TP"]) == (
        "2",
        "2",
        "2",
        "4",
    )
    status = cluster(testbed, ns, "llama")["status"]
    assert status["observedGeneration"] == 1
    assert status["selector"] == "serving.shoal.dev/cluster=llama,serving.shoal.dev/role=leader"
    assert status["endpoint"] == f"http://llama-router.{ns}.svc:8000"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        "Available": "True",
        "Progressing": "False",
        "Degraded": "False",
        "SpecValid": "True",
    }
    assert [r["state"] for r in status["replicaStatuses"]] == ["Serving", "Serving"]
    capacity = status["capacity"]
    assert capacity["layout"] == "TP4xDP2" and capacity["kvTokensPerReplica"] > 0
    measured = wait_for(
        lambda: (
            (m := cluster(testbed, ns, "llama")["status"]["capacity"]["measured"])
            and len(m) == 2
            and m
        ),
        what="measured KV of both replicas",
    )
    assert all(m["kvTokens"] == m["blockSize"] * m["gpuBlocks"] > 0 for m in measured)

    # Requests through the router's address reach both engines.
    url = router_url(testbed, ns, "llama")
    seen: set[str] = set()

    def both_replicas_answer() -> bool:
        response = complete(url, f"request {len(seen)} {time.monotonic()}")
        assert response.status_code == 200, response.text
        seen.add(response.headers["x-shoal-replica"])
        return seen == {"llama-r0-0", "llama-r1-0"}

    wait_for(both_replicas_answer, what="requests on both replicas", timeout=30, interval=0.05)

    # An idle fleet causes no writes.
    offset = (testbed.logs / "audit.log").stat().st_size
    time.sleep(12)
    assert _operator_writes(testbed, ns, offset) == []

    testbed.kubectl("delete", "vllmcluster", "llama", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: all(not children(testbed, ns, "llama", kind) for kind in CHILD_KINDS),
        what="every object of the cluster deleted",
        timeout=60,
    )


def _long_request(url: str, result: dict[str, Any]) -> None:
    try:
        response = httpx.post(
            url + "/v1/completions",
            json={"model": MODEL, "prompt": "drain me", "max_tokens": 1200, "ignore_eos": True},
            timeout=120,
        )
        result["status"] = response.status_code
        result["tokens"] = response.json()["usage"]["completion_tokens"]
    except httpx.HTTPError as error:
        result["error"] = repr(error)


def _running_requests(engine: str) -> float:
    text = httpx.get(engine + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


def test_scale_up_then_down_drains_the_removed_replicas_first(testbed: Testbed, ns: str) -> None:
    # Time scale 1: a 1200-token request runs for several seconds.
    apply(testbed, ns, cluster_manifest("fleet", replicas=2, tensor=4, time_scale=1))
    wait_ready(testbed, ns, "fleet", 2)
    testbed.kubectl("scale", "vllmcluster/fleet", "-n", ns, "--replicas=4")
    wait_ready(testbed, ns, "fleet", 4)
    assert names(children(testbed, ns, "fleet", "statefulsets")) == [
        f"fleet-r{i}" for i in range(4)
    ]

    r3 = next(p for p in leader_pods(testbed, ns, "fleet") if p["metadata"]["name"] == "fleet-r3-0")
    engine = f"http://{r3['status']['podIP']}:8000"
    result: dict[str, Any] = {}
    request = threading.Thread(target=_long_request, args=(engine, result))
    request.start()
    wait_for(lambda: _running_requests(engine) >= 1, what="the request running on r3")

    testbed.kubectl("scale", "vllmcluster/fleet", "-n", ns, "--replicas=1")
    # Out of routing at once...
    wait_for(
        lambda: (
            condition_of(get_json(testbed, "pod", "fleet-r3-0", "-n", ns), WARMED).get("status")
            == "False"
        ),
        what="r3 taken out of routing",
        timeout=15,
    )
    url = router_url(testbed, ns, "fleet")
    wait_for(
        lambda: (
            {complete(url, f"p{i}").headers["x-shoal-replica"] for i in range(6)} == {"fleet-r0-0"}
        ),
        what="the router sending only to r0",
        timeout=30,
    )
    # ... idle replicas removed, r3 kept while its request runs ...
    wait_for(
        lambda: names(children(testbed, ns, "fleet", "statefulsets")) == ["fleet-r0", "fleet-r3"],
        what="r1 and r2 removed",
        timeout=30,
    )
    assert request.is_alive(), "the long request finished before the check; make it longer"
    request.join(timeout=90)
    # ... and the request finished whole before r3 went.
    assert result == {"status": 200, "tokens": 1200}
    wait_for(
        lambda: names(children(testbed, ns, "fleet", "statefulsets")) == ["fleet-r0"],
        what="r3 removed after its request",
        timeout=30,
    )
    wait_ready(testbed, ns, "fleet", 1)
    reasons = [e["reason"] for e in events(testbed, ns, "fleet")]
    assert reasons.count("ReplicaDraining") == 3 and reasons.count("ReplicaRemoved") == 3


def test_tp16_replicas_are_two_node_groups_and_a_killed_worker_restarts_its_leader(
    testbed: Testbed, ns: str
) -> None:
    model = "meta-llama/Llama-3.1-405B-Instruct"
    apply(testbed, ns, cluster_manifest("big", replicas=1, tensor=16, model=model))
    wait_ready(testbed, ns, "big", 1)
    pods = {p["metadata"]["name"]: p for p in children(testbed, ns, "big", "pods")}
    group = {name: pod for name, pod in pods.items() if name.startswith("big-r0")}
    assert sorted(group) == ["big-r0-0", "big-r0-w-1"]
    assert len({p["spec"]["nodeName"] for p in group.values()}) == 2, "group pods share a node"
    for pod in group.values():
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    leader_uid = group["big-r0-0"]["metadata"]["uid"]

    testbed.kubectl("delete", "pod", "big-r0-w-1", "-n", ns, "--wait=true")
    # Between the leader's deletion and its successor the pod may be missing.
    wait_for(
        lambda: any(
            p["metadata"]["name"] == "big-r0-0" and p["metadata"]["uid"] != leader_uid
            for p in children(testbed, ns, "big", "pods")
        ),
        what="the leader restarted with its worker",
        timeout=30,
    )
    wait_ready(testbed, ns, "big", 1)
    entry = cluster(testbed, ns, "big")["status"]["replicaStatuses"][0]
    assert entry["restarts"] >= 1
    assert "big-r0-w-1" in entry["lastRestartReason"]
    assert "GroupRestarted" in [e["reason"] for e in events(testbed, ns, "big")]


def _leaders_by_replica(bed: Testbed, ns: str, name: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["labels"]["serving.shoal.dev/replica"]: p for p in leader_pods(bed, ns, name)
    }


def test_an_image_change_rolls_one_replica_at_a_time_and_a_router_change_only_the_router(
    testbed: Testbed, ns: str
) -> None:
    apply(testbed, ns, cluster_manifest("roll", replicas=3, tensor=4))
    wait_ready(testbed, ns, "roll", 3)
    new_image = "vllm/vllm-openai:v0.32.1"
    testbed.kubectl(
        "patch",
        "vllmcluster",
        "roll",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"image": new_image}}),
    )
    lowest_warm = 3

    def rolled() -> bool:
        nonlocal lowest_warm
        status = cluster(testbed, ns, "roll").get("status", {})
        lowest_warm = min(lowest_warm, status.get("warmReplicas", 0))
        leaders = _leaders_by_replica(testbed, ns, "roll")
        return (
            len(leaders) == 3
            and all(p["spec"]["containers"][0]["image"] == new_image for p in leaders.values())
            and status.get("warmReplicas") == 3
        )

    wait_for(rolled, what="all replicas on the new image and warm", timeout=120, interval=0.2)
    assert lowest_warm >= 2, f"{3 - lowest_warm} replicas were down at once"
    leaders = _leaders_by_replica(testbed, ns, "roll")
    for earlier, later in (("0", "1"), ("1", "2")):
        ready_at = _time(condition_of(leaders[earlier], "Ready")["lastTransitionTime"])
        created_at = _time(leaders[later]["metadata"]["creationTimestamp"])
        assert created_at >= ready_at, f"replica {later} replaced before {earlier} was Ready"

    engines = {
        p["metadata"]["uid"]
        for p in children(testbed, ns, "roll", "pods")
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
    }
    routers = {p["metadata"]["uid"] for p in children(testbed, ns, "roll", "pods")} - engines
    testbed.kubectl(
        "patch",
        "vllmcluster",
        "roll",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"router": {"policy": "round-robin"}}}),
    )

    def router_replaced() -> bool:
        pods = children(testbed, ns, "roll", "pods")
        now_routers = {
            p["metadata"]["uid"]
            for p in pods
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == "router"
            and not p["metadata"].get("deletionTimestamp")
        }
        return bool(now_routers) and not (now_routers & routers)

    wait_for(router_replaced, what="the router pod replaced", timeout=60)
    after = {
        p["metadata"]["uid"]
        for p in children(testbed, ns, "roll", "pods")
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
    }
    assert after == engines, "a router-only change replaced engine pods"


def test_an_invalid_edit_leaves_the_fleet_running_and_says_why(testbed: Testbed, ns: str) -> None:
    apply(testbed, ns, cluster_manifest("steady", replicas=1, tensor=4))
    wait_ready(testbed, ns, "steady", 1)
    before = get_json(testbed, "statefulset", "steady-r0", "-n", ns)
    pod_uid = get_json(testbed, "pod", "steady-r0-0", "-n", ns)["metadata"]["uid"]
    # The API server accepts this; only the planner knows TP 2 leaves too little
    # KV cache for one full-length request of Llama-3.1-70B.
    invalid = {"spec": {"parallelism": {"tensor": 2}, "engine": {"maxModelLen": 131072}}}
    testbed.kubectl(
        "patch", "vllmcluster", "steady", "-n", ns, "--type=merge", "-p", json.dumps(invalid)
    )

    def spec_invalid() -> dict[str, Any] | None:
        status = cluster(testbed, ns, "steady").get("status", {})
        found = {c["type"]: c for c in status.get("conditions", [])}
        spec_valid = found.get("SpecValid", {})
        return spec_valid if spec_valid.get("status") == "False" else None

    reported = wait_for(spec_invalid, what="SpecValid=False", timeout=30)
    assert "spec.engine.maxModelLen" in reported["message"]
    assert "InvalidSpec" in [e["reason"] for e in events(testbed, ns, "steady")]
    time.sleep(3)
    after = get_json(testbed, "statefulset", "steady-r0", "-n", ns)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert get_json(testbed, "pod", "steady-r0-0", "-n", ns)["metadata"]["uid"] == pod_uid
    assert printed_columns(testbed, ns, "steady")["READY"] == "1"
    url = router_url(testbed, ns, "steady")
    assert complete(url, "still serving").status_code == 200


def test_a_paused_cluster_is_left_alone_until_resumed(testbed: Testbed, ns: str) -> None:
    apply(testbed, ns, cluster_manifest("held", replicas=1, tensor=4))
    wait_ready(testbed, ns, "held", 1)
    testbed.kubectl("annotate", "vllmcluster", "held", "-n", ns, "serving.shoal.dev/paused=true")
    testbed.kubectl("scale", "vllmcluster/held", "-n", ns, "--replicas=2")

    def paused() -> bool:
        status = cluster(testbed, ns, "held").get("status", {})
        found = {c["type"]: c for c in status.get("conditions", [])}
        return bool(found.get("Progressing", {}).get("reason") == "Paused")

    wait_for(paused, what="Progressing=False reason Paused", timeout=30)
    time.sleep(3)
    assert names(children(testbed, ns, "held", "statefulsets")) == ["held-r0"]
    testbed.kubectl("annotate", "vllmcluster", "held", "-n", ns, "serving.shoal.dev/paused-")
    wait_ready(testbed, ns, "held", 2)
