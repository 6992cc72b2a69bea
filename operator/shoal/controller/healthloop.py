"""The per-cluster health loop: every spec.health.periodSeconds, check each
target leader (/health, a canary completion, the stall check) with at most
HEALTH_CONCURRENCY checks at once for the operator, and keep one
HealthTracker per leader pod uid. Beside the checks it scrapes the cluster's
router pods' /metrics: what each replica answered through them since the last
round (their shoal_router_requests counters) feeds its tracker too. It runs
beside reconciliation, never in a pass: a pass hands it the current targets
and router pods and reads the latest assessments; the loop wakes the cluster
once a round, after every check of the round is in (so replicas failing at
once are seen at once), when an assessment turned unhealthy or changed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

from shoal.api.router import INTERNAL_PORT
from shoal.api.spec import HealthSpec
from shoal.controller.identity import ClusterRef
from shoal.controller.names import ENGINE_PORT
from shoal.engine.client import HEALTH_DEADLINE_SECONDS, METRICS_DEADLINE_SECONDS, EngineClient
from shoal.engine.endpoints import base_url
from shoal.engine.errors import EngineError
from shoal.health.assess import Assessment, HealthTracker, Probe
from shoal.health.probe import probe
from shoal.health.router_errors import (
    Routed,
    RouterErrorWindow,
    parse_router_requests,
)

log = logging.getLogger(__name__)

HEALTH_CONCURRENCY = 16


@dataclass(frozen=True)
class Target:
    ip: str
    model: str
    name: str = ""  # the leader pod's name: the routers' replica label
    # The API keys its canary may send, the one it was started with first
    # (another after a 401: controller/enginekeys.py); None: no key.
    keys: tuple[str | None, ...] = (None,)


class _ClusterChecks:
    def __init__(self, health: HealthSpec, wake: Callable[[], None]) -> None:
        self.health = health
        self.wake = wake
        self.targets: dict[str, Target] = {}
        self.routers: dict[str, str] = {}  # router pod uid -> IP
        self.window = RouterErrorWindow()
        self.trackers: dict[str, HealthTracker] = {}
        self.latest: dict[str, Assessment] = {}
        self.task: asyncio.Task[None] | None = None


class HealthChecks:
    def __init__(self, *, engine: EngineClient, concurrency: int = HEALTH_CONCURRENCY) -> None:
        self._engine = engine  # the operator's; its owner closes it
        self._limit = asyncio.Semaphore(concurrency)
        self._clusters: dict[ClusterRef, _ClusterChecks] = {}

    def update(
        self,
        ref: ClusterRef,
        health: HealthSpec,
        targets: dict[str, Target],
        wake: Callable[[], None],
        routers: Mapping[str, str] | None = None,
    ) -> dict[str, Assessment]:
        """Set the cluster's targets (by pod uid, each with the API key its
        canary sends) and router pods (uid -> IP, scraped for per-replica
        errors when spec.health.routerErrors is enabled); the latest
        assessments of the targets."""
        checks = self._clusters.get(ref)
        if checks is None:
            checks = self._clusters[ref] = _ClusterChecks(health, wake)
        checks.health, checks.wake, checks.targets = health, wake, dict(targets)
        checks.routers = dict(routers or {}) if health.router_errors.enabled else {}
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

    async def _loop(self, checks: _ClusterChecks) -> None:
        while checks.targets:
            targets = dict(checks.targets)
            scraping = asyncio.create_task(self._routed(checks))
            found = await asyncio.gather(*(self._probe(checks, t) for t in targets.values()))
            routed = await scraping
            wake = False
            for (uid, target), result in zip(targets.items(), found, strict=True):
                if result is not None and uid in checks.targets:  # not gone meanwhile
                    wake |= self._assess(checks, uid, target, result, routed.get(target.name))
            if wake:
                with contextlib.suppress(Exception):
                    checks.wake()
            await asyncio.sleep(checks.health.period_seconds)

    async def _probe(self, checks: _ClusterChecks, target: Target) -> Probe | None:
        async with self._limit:
            try:
                found = None
                for key in target.keys:
                    found = await probe(
                        self._engine.with_key(key),
                        base_url(target.ip, port=ENGINE_PORT),
                        model=target.model,
                        health_timeout=HEALTH_DEADLINE_SECONDS,
                        canary_timeout=float(checks.health.canary_timeout_seconds),
                    )
                    if found.canary_status != HTTPStatus.UNAUTHORIZED:
                        break
                return found
            except Exception:  # a bug in one check must not end the loop
                log.exception("health check of %s failed", target.ip)
                return None

    async def _routed(self, checks: _ClusterChecks) -> dict[str, Routed]:
        """What each replica (by pod name) answered through the routers since
        the last round; empty when no router is known or none answered."""
        routers = dict(checks.routers)
        scrapes = await asyncio.gather(*(self._router_counts(ip) for ip in routers.values()))
        return checks.window.advance(dict(zip(routers, scrapes, strict=True)))

    async def _router_counts(self, ip: str) -> dict[str, Routed] | None:
        try:
            # The internal port, as the autoscaler's: the client port may be
            # full (maxClientConnections) or closed to the operator by the
            # NetworkPolicy (router.networkPolicy.clientsFrom).
            response = await self._engine.get(
                base_url(ip, port=INTERNAL_PORT) + "/metrics", deadline=METRICS_DEADLINE_SECONDS
            )
            if response.status != 200:
                return None
            return parse_router_requests(response.text)
        except (EngineError, ValueError):
            return None

    def _assess(
        self,
        checks: _ClusterChecks,
        uid: str,
        target: Target,
        found: Probe,
        routed: Routed | None,
    ) -> bool:
        """Record the assessment; whether the cluster should look at it now."""
        health = checks.health
        tracker = checks.trackers.get(uid)
        if tracker is None:
            tracker = checks.trackers[uid] = HealthTracker(
                stall_seconds=health.stall_seconds, failure_threshold=health.failure_threshold
            )
        # As spec.health says now, with what it has seen: an edit reaches running pods.
        tracker.stall_seconds = float(health.stall_seconds)
        tracker.failure_threshold = health.failure_threshold
        tracker.error_rate_threshold = health.router_errors.threshold
        tracker.routed_min_requests = health.router_errors.min_requests
        assessment = tracker.observe(found, routed=routed)
        before = checks.latest.get(uid)
        checks.latest[uid] = assessment
        changed = before is None or (before.reason, before.unhealthy) != (
            assessment.reason,
            assessment.unhealthy,
        )
        if not assessment.ok:
            log.info("%s: %s (%d in a row)", target.ip, assessment.detail, assessment.consecutive)
        return changed and (assessment.unhealthy or before is not None)
