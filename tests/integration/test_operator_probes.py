"""The operator's engine probes against real simulators: /health while up or
not, the KV pool from vllm:cache_config_info, and in-flight requests."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx

from shoal.controller.probes import EngineProbe
from shoal.engine.client import EngineClient
from shoal.engine.metrics import MetricsSnapshot
from tests.integration.procs import MODEL, free_port, sims


async def _probe(ip: str, port: int) -> tuple[bool, MetricsSnapshot | None]:
    async with EngineClient() as engine:
        prober = EngineProbe(engine, port=port)
        return await prober.healthy(ip), await prober.metrics(ip)


def test_probes_read_health_kv_pool_and_in_flight_requests(tmp_path: Path) -> None:
    blocks = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096"]
    with sims(1, tmp_path, extra=blocks, time_scale=1) as engines:
        url = engines[0]
        ip, port = url.removeprefix("http://").split(":")
        result: dict[str, int] = {}

        def long_request() -> None:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 400, "ignore_eos": True}
            result["status"] = httpx.post(
                url + "/v1/completions", json=body, timeout=60
            ).status_code

        request = threading.Thread(target=long_request)
        request.start()
        for _ in range(50):  # until the engine has it running
            healthy, metrics = asyncio.run(_probe(ip, int(port)))
            if metrics is not None and metrics.in_flight:
                break
        request.join()
        assert healthy is True
        assert metrics is not None and metrics.kv_pool is not None
        assert metrics.kv_pool.tokens == 1024 * metrics.kv_pool.block_size
        assert metrics.in_flight == 1
        assert result["status"] == 200
        idle = asyncio.run(_probe(ip, int(port)))[1]
        assert idle is not None and idle.in_flight == 0
    assert asyncio.run(_probe("127.0.0.1", free_port())) == (False, None)
