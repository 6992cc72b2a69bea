"""Warm-up gating on the testbed: a replica added to a serving fleet stays
out of rotation (Running, not Ready) until the operator warmed its prefix
cache and verified it, and the router sends it nothing before."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    MODEL,
    WARMED,
    cluster,
    cluster_manifest,
    condition_of,
    events,
    printed_columns,
    router_url,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-wu"
# Shared prefixes many blocks long, as system prompts are.
PROMPTS = [
    {"text": f"You are assistant number {i}. " + " ".join(f"rule{j} applies" for j in range(150))}
    for i in range(6)
]


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class SteadyLoad:
    """Requests through the router one after another; (start time, replica) of each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.routed: list[tuple[float, str]] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                started = time.time()
                body = {"model": MODEL, "prompt": f"question {n}", "max_tokens": 2}
                try:
                    response = client.post(self.url + "/v1/completions", json=body)
                    if response.status_code == 200:
                        self.routed.append((started, response.headers["x-shoal-replica"]))
                    else:
                        self.failed.append(f"{response.status_code}: {response.text[:100]}")
                except httpx.HTTPError as error:
                    self.failed.append(repr(error))
                n += 1
                time.sleep(0.05)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=35)


def test_a_new_replica_takes_traffic_only_once_its_warm_up_verified_it_warm(
    testbed: Testbed, ns: str
) -> None:
    manifest = cluster_manifest(
        "warm",
        replicas=2,
        tensor=4,
        warmup={"prompts": PROMPTS, "timeoutSeconds": 60, "minHitRatio": 0.8},
    )
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "warm", 2)
    url = router_url(testbed, ns, "warm")
    with SteadyLoad(url) as load:
        wait_for(lambda: len(load.routed) >= 5, what="steady load flowing", timeout=30)
        testbed.kubectl("scale", "vllmcluster/warm", "-n", ns, "--replicas=3")

        def new_pod() -> dict[str, Any] | None:
            found = get_json(testbed, "pods", "-n", ns, "--ignore-not-found", "-o", "json")
            pods = {p["metadata"]["name"]: p for p in found.get("items", [])}
            return pods.get("warm-r2-0")

        # Running (its container up) but not Ready while it warms.
        seen_unready_running = False

        def admitted() -> dict[str, Any] | None:
            nonlocal seen_unready_running
            pod = new_pod()
            if pod is None:
                return None
            ready = condition_of(pod, "Ready").get("status") == "True"
            running = pod.get("status", {}).get("phase") == "Running"
            if running and not ready:
                seen_unready_running = True
                assert condition_of(pod, WARMED).get("status") != "True"
            return pod if condition_of(pod, WARMED).get("status") == "True" else None

        pod = wait_for(admitted, what="warm-r2-0 admitted", timeout=90, interval=0.2)
        gate = condition_of(pod, WARMED)
        wait_ready(testbed, ns, "warm", 3)
        wait_for(
            lambda: any(r == "warm-r2-0" for _, r in load.routed),
            what="routed requests reaching the new replica",
            timeout=30,
        )
    assert seen_unready_running, "never saw warm-r2-0 Running but not Ready"
    assert gate["reason"] == "Warmed", gate
    assert "prompts sent" in gate["message"] and "hit ratio" in gate["message"]
    # The router sent the new replica nothing before the gate opened (the
    # condition's time is truncated to the second: compare with that second).
    admitted_at = _time(gate["lastTransitionTime"])
    early = [t for t, replica in load.routed if replica == "warm-r2-0" and t < admitted_at]
    assert early == [], f"{len(early)} requests reached warm-r2-0 before it was admitted"
    assert load.failed == []

    status = cluster(testbed, ns, "warm")["status"]
    entry = next(r for r in status["replicaStatuses"] if r["index"] == 2)
    print(f"\nwarm-r2-0: {entry['warmup']}")
    assert entry["state"] == "Serving"
    assert entry["warmupHitRatio"] >= 0.8
    assert "Warm" in entry["warmup"]
    assert printed_columns(testbed, ns, "warm")["WARM"] == "3"
    reasons = [e["reason"] for e in events(testbed, ns, "warm")]
    assert "ReplicaAdmitted" in reasons
