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

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import (
    MODEL,
    WARMED,
    children,
    cluster_manifest,
    condition_of,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-engine-key"

KEY = "sk-engine-e2e-0001"
BODY = {"model": MODEL, "prompt": "who goes there", "max_tokens": 2}
PROMPT = {"text": "You are the fleet's shared system prompt. " * 60}


def _pods(bed: Testbed, ns: str, name: str, component: str) -> list[dict[str, Any]]:
    return [
        pod
        for pod in children(bed, ns, name, "pods")
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == component
        and pod.get("status", {}).get("podIP")
    ]


def test_a_fleet_whose_engines_require_a_key_warms_up_and_serves_through_its_router(
    testbed: Testbed, ns: str
) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "engine-key"},
        "type": "Opaque",
        "stringData": {"key": KEY},
    }
    apply(testbed, ns, secret)
    spec = cluster_manifest("keyed-engines", replicas=1, tensor=4)
    spec["spec"]["engine"]["apiKeySecret"] = {"name": "engine-key", "key": "key"}
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
