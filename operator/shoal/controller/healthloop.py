"""The per-cluster health loop: every spec.health.periodSeconds, check each
target leader (/health, a canary completion, the stall check) with at most
HEALTH_CONCURRENCY checks at once for the operator, and keep one
HealthTracker per leader pod uid. It runs beside reconciliation, never in a
pass: a pass hands it the current targets and reads the latest assessments;
the loop wakes the cluster when an assessment turns unhealthy or changes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from shoal.api.spec import HealthSpec
from shoal.controller.identity import ClusterRef
from shoal.controller.probes import HEALTH_TIMEOUT_SECONDS, engine_url
from shoal.health.assess import Assessment, HealthTracker
from shoal.health.probe import probe

log = logging.getLogger(__name__)

HEALTH_CONCURRENCY = 16


@dataclass(frozen=True)
class Target:
    ip: str
    model: str


class _ClusterChecks:
    def __init__(self, health: HealthSpec, wake: Callable[[], None]) -> None:
        self.health = health
        self.wake = wake
        self.targets: dict[str, Target] = {}
        self.trackers: dict[str, HealthTracker] = {}
        self.latest: dict[str, Assessment] = {}
        self.task: asyncio.Task[None] | None = None


class HealthChecks:
    def __init__(self, *, concurrency: int = HEALTH_CONCURRENCY) -> None:
        self._limit = asyncio.Semaphore(concurrency)
        self._clusters: dict[ClusterRef, _ClusterChecks] = {}
        self._client: httpx.AsyncClient | None = None

    def update(
        self,
        ref: ClusterRef,
        health: HealthSpec,
        targets: dict[str, Target],
        wake: Callable[[], None],
    ) -> dict[str, Assessment]:
        """Set the cluster's targets (by pod uid); the latest assessments of them."""
        checks = self._clusters.get(ref)
        if checks is None:
            checks = self._clusters[ref] = _ClusterChecks(health, wake)
        checks.health, checks.wake, checks.targets = health, wake, dict(targets)
        for uid in [u for u in checks.trackers if u not in targets]:
            del checks.trackers[uid]
            checks.latest.pop(uid, None)
        if targets and (checks.task is None or checks.task.done()):
            checks.task = asyncio.create_task(self._loop(checks))
        return {uid: a for uid, a in checks.latest.items() if uid in targets}

    def forget(self, ref: ClusterRef) -> None:
        checks = self._clusters.pop(ref, None)
        if checks is not None and checks.task is not None:
            checks.task.cancel()

    async def close(self) -> None:
        for ref in list(self._clusters):
            self.forget(ref)
        if self._client is not None:
            await self._client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client

    async def _loop(self, checks: _ClusterChecks) -> None:
        while checks.targets:
            await asyncio.gather(
                *(self._check(checks, uid, target) for uid, target in checks.targets.items())
            )
            await asyncio.sleep(checks.health.period_seconds)

    async def _check(self, checks: _ClusterChecks, uid: str, target: Target) -> None:
        health = checks.health
        async with self._limit:
            try:
                found = await probe(
                    self._http(),
                    engine_url(target.ip, ""),
                    model=target.model,
                    health_timeout=HEALTH_TIMEOUT_SECONDS,
                    canary_timeout=float(health.canary_timeout_seconds),
                )
            except Exception:  # a bug in one check must not end the loop
                log.exception("health check of %s failed", target.ip)
                return
        if uid not in checks.targets:
            return  # gone while it was checked
        tracker = checks.trackers.get(uid)
        if tracker is None:
            tracker = checks.trackers[uid] = HealthTracker(
                stall_seconds=float(health.stall_seconds),
                failure_threshold=health.failure_threshold,
            )
        assessment = tracker.observe(found)
        before = checks.latest.get(uid)
        checks.latest[uid] = assessment
        changed = before is None or (before.reason, before.unhealthy) != (
            assessment.reason,
            assessment.unhealthy,
        )
        if not assessment.ok:
            log.info("%s: %s (%d in a row)", target.ip, assessment.detail, assessment.consecutive)
        if changed and (assessment.unhealthy or before is not None):
            with contextlib.suppress(Exception):
                checks.wake()
