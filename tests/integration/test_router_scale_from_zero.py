"""A router with no replica (the fleet scaled to zero), its pods discovered
through a stand-in API server's watch: it stays Ready, holds requests and
counts them in shoal_router_queue_depth (what the autoscaler reads), serves
them once a replica turns Ready, and past queue.zeroReplicaWaitSeconds
answers an OpenAI-shaped 503 with Retry-After. The same on the real control
plane, through the operator, is tests/e2e/test_autoscaling.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal.router.app import Discovery, Router
from shoal.router.config import RouterConfig
from tests.integration.fake_apiserver import fake_apiserver
from tests.integration.procs import MODEL, sims
from tests.router_served import RouterTestServer

PODS = "/api/v1/namespaces/team/pods"
BODY = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}


def engine_pod(port: int) -> dict[str, Any]:
    del port  # the router reaches it at podIP:enginePort
    return {
        "metadata": {"name": "c-r0-0", "uid": "uid-r0", "namespace": "team"},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@asynccontextmanager
async def router_at_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, wait: int, engine_port: int
) -> AsyncIterator[tuple[str, asyncio.Queue[dict[str, Any] | None]]]:
    """A router watching no engine pod yet; its URL and the watch to feed."""
    async with fake_apiserver(tmp_path) as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig))
        server.answers[("GET", PODS)] = (
            200,
            {"metadata": {"resourceVersion": "1"}, "items": []},
        )
        watch: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        server.watches.put_nowait(watch)
        config = RouterConfig.model_validate(
            {"queue": {"zeroReplicaWaitSeconds": wait, "retryAfterSeconds": 7}}
        )
        router = Router(
            config,
            Discovery(namespace="team", selector="app=eng", engine_port=engine_port),
        )
        await router.start()
        async with RouterTestServer(router) as served:
            try:
                yield f"http://127.0.0.1:{served.port}", watch
            finally:
                watch.put_nowait(None)
                await router.stop()


def queue_depth(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("shoal_router_queue_depth "):
            return float(line.split()[1])
    raise AssertionError("no shoal_router_queue_depth")


def test_a_request_at_zero_replicas_is_held_and_served_once_a_replica_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sims(1, tmp_path) as engines:
        port = int(engines[0].rsplit(":", 1)[1])

        async def main() -> None:
            async with (
                router_at_zero(tmp_path, monkeypatch, wait=30, engine_port=port) as (url, watch),
                httpx.AsyncClient(timeout=40) as client,
            ):
                assert (await client.get(url + "/ready")).status_code == 200
                held = [
                    asyncio.create_task(client.post(url + "/v1/completions", json=BODY))
                    for _ in range(3)
                ]
                for _ in range(100):
                    metrics = (await client.get(url + "/metrics")).text
                    if queue_depth(metrics) == 3:
                        break
                    await asyncio.sleep(0.05)
                assert queue_depth(metrics) == 3, "held requests are not counted"
                assert not any(task.done() for task in held)
                watch.put_nowait({"type": "ADDED", "object": engine_pod(port)})
                answers = await asyncio.gather(*held)
                assert [a.status_code for a in answers] == [200, 200, 200]
                metrics = (await client.get(url + "/metrics")).text
                assert queue_depth(metrics) == 0
                assert "shoal_router_zero_replica_wait_seconds_count 3.0" in metrics

        asyncio.run(main())


def test_past_the_wait_a_request_at_zero_gets_an_openai_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with (
            router_at_zero(tmp_path, monkeypatch, wait=1, engine_port=1) as (url, _),
            httpx.AsyncClient(timeout=10) as client,
        ):
            answer = await client.post(url + "/v1/completions", json=BODY)
            assert answer.status_code == 503
            assert answer.headers["Retry-After"] == "7"
            error = answer.json()["error"]
            assert "No replica started within 1 seconds" in error["message"]
            assert error["type"]

    asyncio.run(main())
