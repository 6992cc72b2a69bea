"""One round of checks against one engine: `/health` and `/metrics` under a
deadline, and a canary completion (`max_tokens: 1`) under its own deadline,
with the generated-token counter read around it."""

from __future__ import annotations

import asyncio
import time

import httpx

from shoal.health.assess import Outcome, Probe
from shoal.router.signals import EngineSignals, parse_metrics


async def _metrics(
    client: httpx.AsyncClient, endpoint: str, deadline: float
) -> EngineSignals | None:
    try:
        response = await client.get(endpoint + "/metrics", timeout=deadline)
        if response.status_code != 200:
            return None
        return parse_metrics(response.text)
    except (httpx.HTTPError, ValueError):
        return None


async def _health(
    client: httpx.AsyncClient, endpoint: str, deadline: float
) -> tuple[Outcome, int | None]:
    try:
        response = await client.get(endpoint + "/health", timeout=deadline)
    except httpx.TimeoutException:
        return Outcome.TIMEOUT, None
    except httpx.HTTPError:
        return Outcome.REFUSED, None
    return (Outcome.OK if response.status_code == 200 else Outcome.ERROR), response.status_code


async def _canary(
    client: httpx.AsyncClient, endpoint: str, model: str, deadline: float
) -> tuple[Outcome, int | None]:
    body = {"model": model, "prompt": "shoal canary", "max_tokens": 1}
    try:
        response = await client.post(endpoint + "/v1/completions", json=body, timeout=deadline)
    except httpx.TimeoutException:
        return Outcome.TIMEOUT, None
    except httpx.HTTPError:
        return Outcome.REFUSED, None
    return (Outcome.OK if response.status_code == 200 else Outcome.ERROR), response.status_code


async def model_name(client: httpx.AsyncClient, endpoint: str, deadline: float) -> str | None:
    try:
        response = await client.get(endpoint + "/v1/models", timeout=deadline)
        models = response.json().get("data") or []
        return str(models[0]["id"]) if models else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


async def probe(
    client: httpx.AsyncClient,
    endpoint: str,
    *,
    model: str | None,
    health_timeout: float = 5.0,
    canary_timeout: float = 10.0,
) -> Probe:
    endpoint = endpoint.rstrip("/")
    at = time.monotonic()
    (health, health_status), before = await asyncio.gather(
        _health(client, endpoint, health_timeout), _metrics(client, endpoint, health_timeout)
    )
    if health is not Outcome.OK:
        return Probe(at=at, health=health, health_status=health_status, metrics_ok=False)
    canary, canary_status = Outcome.SKIPPED, None
    if model is not None:
        canary, canary_status = await _canary(client, endpoint, model, canary_timeout)
    after = await _metrics(client, endpoint, health_timeout)
    during = None
    if before is not None and after is not None:
        during = after.generation_tokens - before.generation_tokens
    latest = after or before
    return Probe(
        at=at,
        health=health,
        health_status=health_status,
        canary=canary,
        canary_status=canary_status,
        metrics_ok=before is not None and after is not None,
        running=latest.running if latest else 0.0,
        generation_tokens=latest.generation_tokens if latest else None,
        tokens_during_canary=during,
    )
