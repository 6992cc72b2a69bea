"""Engines with an API key through the operator: spec.engine.apiKeySecret
names a Secret whose key the engines get as VLLM_API_KEY (the pod runner
resolves it as kubelet does; the simulator then guards /v1 as vLLM does).
The operator's warm-up and canary send it (read from the Secret), the router
pod has it mounted and sends it to the engines, so the fleet warms up and
serves through the router, while an engine asked directly without the key
refuses."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from shoal.controller.decide import EventReason
from shoal.controller.enginekeys import key_digest
from shoal.controller.names import ANNOTATION_ENGINE_KEY
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import (
    MODEL,
    WARMED,
    children,
    cluster_manifest,
    condition_of,
    events,
    router_url,
    wait_ready,
)
from tests.e2e.test_warmup_gating import SteadyLoad

pytestmark = pytest.mark.e2e

PATTERN = "shoal-engine-key"

KEY = "sk-engine-e2e-0001"
NEW_KEY = "sk-engine-e2e-0002"
BODY = {"model": MODEL, "prompt": "who goes there", "max_tokens": 2}
PROMPT = {"text": "You are the fleet's shared system prompt. " * 60}


def _pods(bed: Testbed, ns: str, name: str, component: str) -> list[dict[str, Any]]:
    return [
        pod
        for pod in children(bed, ns, name, "pods")
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == component
        and pod.get("status", {}).get("podIP")
    ]


def _key_secret(name: str, key: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "stringData": {"key": key},
    }


def _keyed(name: str, *, secret: str, replicas: int) -> dict[str, Any]:
    """A cluster whose engines require the key in Secret `secret`."""
    spec = cluster_manifest(name, replicas=replicas, tensor=4)
    spec["spec"]["engine"]["apiKeySecret"] = {"name": secret, "key": "key"}
    return spec


def test_a_fleet_whose_engines_require_a_key_warms_up_and_serves_through_its_router(
    testbed: Testbed, ns: str
) -> None:
    apply(testbed, ns, _key_secret("engine-key", KEY))
    spec = _keyed("keyed-engines", secret="engine-key", replicas=1)
    # Held, not admitted, when the warm-up cannot run: a warm-up refused
    # by the engine leaves the replica out instead of passing quietly.
    spec["spec"]["warmup"] = {"prompts": [PROMPT], "onTimeout": "Hold", "timeoutSeconds": 60}
    apply(testbed, ns, spec)
    wait_ready(testbed, ns, "keyed-engines", 1, timeout=180)

    [engine] = [p for p in _pods(testbed, ns, "keyed-engines", "engine")]
    assert condition_of(engine, WARMED)["status"] == "True"
    container = engine["spec"]["containers"][0]
    assert not any(KEY in arg or "api-key" in arg for arg in container["args"])
    engine_url = f"http://{engine['status']['podIP']}:8000"
    refused = httpx.post(engine_url + "/v1/completions", json=BODY, timeout=30)
    assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    keyed = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(
        engine_url + "/v1/completions", json=BODY, headers=keyed, timeout=30
    ).is_success

    def served() -> httpx.Response | None:
        for pod in _pods(testbed, ns, "keyed-engines", "router"):
            url = f"http://{pod['status']['podIP']}:8000"
            try:
                answer = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
            except httpx.HTTPError:
                continue
            if answer.status_code == 200:
                return answer
        return None

    answer = wait_for(served, what="a completion through the router", timeout=90)
    assert answer.json()["usage"]["completion_tokens"] == 2


def _digests(bed: Testbed, ns: str, name: str) -> set[str | None]:
    """The key digests the cluster's engine pods were started with."""
    return {
        pod["metadata"].get("annotations", {}).get(ANNOTATION_ENGINE_KEY)
        for pod in _pods(bed, ns, name, "engine")
    }


def test_a_rotated_engine_key_rolls_the_engines_one_at_a_time_losing_no_request(
    testbed: Testbed, ns: str
) -> None:
    # vLLM reads its key once: a Secret changed in place reached the routers
    # (a mounted file) but no engine, which kept the old key until restarted
    # by hand (before: none restarted within 300 s).
    apply(testbed, ns, _key_secret("rotated-key", KEY))
    apply(testbed, ns, _keyed("rotated", secret="rotated-key", replicas=2))
    wait_ready(testbed, ns, "rotated", 2, timeout=180)
    assert _digests(testbed, ns, "rotated") == {key_digest(KEY)}
    url = router_url(testbed, ns, "rotated")
    with SteadyLoad(url, pause=0.05) as load:
        wait_for(lambda: len(load.spans) >= 10, what="steady load flowing", timeout=30)
        apply(testbed, ns, _key_secret("rotated-key", NEW_KEY))
        wait_for(
            lambda: _digests(testbed, ns, "rotated") == {key_digest(NEW_KEY)},
            what="every engine restarted with the new key",
            timeout=300,
            interval=1,
        )
        wait_ready(testbed, ns, "rotated", 2, timeout=120)
        served = len(load.spans)
        wait_for(lambda: len(load.spans) >= served + 10, what="load served after", timeout=60)
    assert load.failed == [], load.failed[:5]
    replaced = [
        e
        for e in events(testbed, ns, "rotated")
        if e.get("reason") == EventReason.REPLICA_REPLACING
    ]
    assert len(replaced) == 2, replaced  # each once, as maxUnavailable 1 lets them go
    for pod in _pods(testbed, ns, "rotated", "engine"):
        engine_url = f"http://{pod['status']['podIP']}:8000"
        keyed = {"Authorization": f"Bearer {NEW_KEY}"}
        answer = httpx.post(engine_url + "/v1/completions", json=BODY, headers=keyed, timeout=30)
        assert answer.is_success, answer.text
