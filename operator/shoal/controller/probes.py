"""The operator's checks of a leader pod's engine, by pod IP: /health and
/metrics, over the operator's one engine client and its short deadlines (a
slow engine must not hold up the reconciliation of its cluster); and the
engines' API key, which the canary and warm-up send (vLLM leaves /health and
/metrics open)."""

from __future__ import annotations

import base64
import binascii
import logging

from shoal.api.spec import SecretKeyRef, VLLMClusterSpec
from shoal.controller.kube import KubeApi
from shoal.controller.names import ENGINE_PORT
from shoal.engine.client import EngineClient
from shoal.engine.endpoints import base_url
from shoal.engine.errors import EngineError
from shoal.engine.metrics import MetricsSnapshot

log = logging.getLogger(__name__)


async def engine_key(kube: KubeApi, *, namespace: str, spec: VLLMClusterSpec) -> str | None:
    """The API key the cluster's engines were given (spec.engine.apiKeySecret),
    for the operator's canary and warm-up (vLLM guards /v1): its first line,
    as the router reads its mounted copy. None without one, or when the Secret
    or its key is missing (the engines cannot start then either)."""
    return await _first_key(kube, namespace, spec.engine.api_key_secret, what="engine API key")


async def router_key(kube: KubeApi, *, namespace: str, spec: VLLMClusterSpec) -> str | None:
    """A key the cluster's routers accept (spec.router.apiKeySecret's first
    line), for the operator's reads of their hot prefixes; None without one."""
    return await _first_key(kube, namespace, spec.router.api_key_secret, what="router API key")


async def _first_key(
    kube: KubeApi, namespace: str, secret: SecretKeyRef | None, *, what: str
) -> str | None:
    if secret is None:
        return None
    found = await kube.get("v1", "Secret", namespace, secret.name)
    encoded = ((found or {}).get("data") or {}).get(secret.key)
    if not encoded:
        log.warning("%s: Secret %s/%s has no key %r", what, namespace, secret.name, secret.key)
        return None
    try:
        lines = base64.b64decode(encoded).decode().splitlines()
    except (binascii.Error, UnicodeDecodeError):
        log.warning("%s: %s/%s[%s] is not text", what, namespace, secret.name, secret.key)
        return None
    return next((line.strip() for line in lines if line.strip()), None)


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
