"""One round of checks against one engine: `/health` and `/metrics` under a
deadline, and a canary completion (`max_tokens: 1`) under its own deadline,
with the generated-token counter read around it."""

from __future__ import annotations

import asyncio
import time

from shoal.engine.client import HEALTH_DEADLINE_SECONDS, EngineClient
from shoal.engine.errors import EngineError, ErrorStatus, TimedOut, Unreachable
from shoal.engine.metrics import MetricsSnapshot
from shoal.health.assess import Outcome, Probe


async def _metrics(engine: EngineClient, endpoint: str, deadline: float) -> MetricsSnapshot | None:
    try:
        return await engine.metrics(endpoint, deadline=deadline)
    except EngineError:
        return None


async def _health(
    engine: EngineClient, endpoint: str, deadline: float
) -> tuple[Outcome, int | None]:
    try:
        status = await engine.health(endpoint, deadline=deadline)
    except TimedOut:
        return Outcome.TIMEOUT, None
    except Unreachable:
        return Outcome.REFUSED, None
    return (Outcome.OK if status == 200 else Outcome.ERROR), status


async def _canary(
    engine: EngineClient, endpoint: str, *, model: str, deadline: float
) -> tuple[Outcome, int | None]:
    try:
        await engine.canary(endpoint, model=model, deadline=deadline)
    except TimedOut:
        return Outcome.TIMEOUT, None
    except Unreachable:
        return Outcome.REFUSED, None
    except ErrorStatus as error:
        return Outcome.ERROR, error.status
    return Outcome.OK, 200


async def probe(
    engine: EngineClient,
    endpoint: str,
    *,
    model: str | None,
    health_timeout: float = HEALTH_DEADLINE_SECONDS,
    canary_timeout: float = 10.0,
) -> Probe:
    at = time.monotonic()
    (health, health_status), before = await asyncio.gather(
        _health(engine, endpoint, health_timeout), _metrics(engine, endpoint, health_timeout)
    )
    if health is not Outcome.OK:
        return Probe(at=at, health=health, health_status=health_status, metrics_ok=False)
    canary, canary_status = Outcome.SKIPPED, None
    if model is not None:
        canary, canary_status = await _canary(
            engine, endpoint, model=model, deadline=canary_timeout
        )
    after = await _metrics(engine, endpoint, health_timeout)
    during = None
    if before is not None and after is not None:
        during = after.progress - before.progress
    latest = after or before
    return Probe(
        at=at,
        health=health,
        health_status=health_status,
        canary=canary,
        canary_status=canary_status,
        metrics_ok=before is not None and after is not None,
        running=latest.running if latest else 0.0,
        progress=latest.progress if latest else None,
        progress_during_canary=during,
    )
