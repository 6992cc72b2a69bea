"""HTTP to engines: /health and /metrics of a leader pod. One aiohttp session
for the operator; short deadlines, as a slow engine must not hold up the
reconciliation of its cluster."""

from __future__ import annotations

import aiohttp

from shoal.controller.engine_metrics import EngineMetrics, parse_engine_metrics
from shoal.controller.names import ENGINE_PORT

HEALTH_TIMEOUT_SECONDS = 2.0
METRICS_TIMEOUT_SECONDS = 3.0


def engine_url(pod_ip: str, path: str, *, port: int = ENGINE_PORT) -> str:
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}{path}"


class EngineProbe:
    def __init__(self, *, port: int = ENGINE_PORT) -> None:
        self.port = port
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _url(self, pod_ip: str, path: str) -> str:
        return engine_url(pod_ip, path, port=self.port)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def healthy(self, pod_ip: str) -> bool:
        """True when the engine answers /health with 200 (vLLM refuses
        connections while loading)."""
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_SECONDS)
        try:
            async with self._client().get(self._url(pod_ip, "/health"), timeout=timeout) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def metrics(self, pod_ip: str) -> EngineMetrics | None:
        timeout = aiohttp.ClientTimeout(total=METRICS_TIMEOUT_SECONDS)
        try:
            async with self._client().get(self._url(pod_ip, "/metrics"), timeout=timeout) as r:
                if r.status != 200:
                    return None
                return parse_engine_metrics(await r.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
