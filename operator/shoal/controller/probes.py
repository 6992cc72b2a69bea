"""The operator's checks of a leader pod's engine, by pod IP: /health and
/metrics, over the operator's one engine client and its short deadlines (a
slow engine must not hold up the reconciliation of its cluster)."""

from __future__ import annotations

from shoal.controller.names import ENGINE_PORT
from shoal.engine.client import EngineClient
from shoal.engine.endpoints import base_url
from shoal.engine.errors import EngineError
from shoal.engine.metrics import MetricsSnapshot


class EngineProbe:
    def __init__(self, engine: EngineClient, *, port: int = ENGINE_PORT) -> None:
        self.engine = engine
        self.port = port

    def url(self, pod_ip: str) -> str:
        return base_url(pod_ip, port=self.port)

    async def healthy(self, pod_ip: str) -> bool:
        """True when the engine answers /health with 200 (vLLM refuses
        connections while loading)."""
        try:
            return await self.engine.health(self.url(pod_ip)) == 200
        except EngineError:
            return False

    async def metrics(self, pod_ip: str) -> MetricsSnapshot | None:
        """None when the engine did not answer a whole scrape."""
        try:
            return await self.engine.metrics(self.url(pod_ip))
        except EngineError:
            return None
