"""Background scraping of every replica's `/metrics`, concurrently, each
under a deadline. The request path never scrapes; it reads the latest
values. A scrape that fails, times out or is not a whole vLLM exposition
(`shoal.engine.metrics.parse`) makes the replica's load unknown (routable,
counted busy: see `fleet`), counts in `shoal_router_scrape_failures_total`,
and logs one WARNING per episode (and an INFO line when it ends). The fetch
stays on aiohttp, the router's own stack."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp

from shoal.engine import endpoints
from shoal.engine.errors import BadMetrics
from shoal.engine.metrics import MetricsSnapshot, parse
from shoal.router.fleet import Fleet, Replica
from shoal.router.metrics import RouterMetrics

log = logging.getLogger("shoal.router.scrape")


class Scraper:
    def __init__(
        self,
        *,
        fleet: Fleet,
        metrics: RouterMetrics,
        on_change: Callable[[], Awaitable[None]],
    ) -> None:
        self.fleet = fleet
        self.metrics = metrics
        self.on_change = on_change
        self.session: aiohttp.ClientSession | None = None
        self.scrapes = 0

    async def run(self) -> None:
        config = self.fleet.config
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=config.scrape_timeout_seconds)
        )
        try:
            while True:
                started = time.monotonic()
                replicas = list(self.fleet.replicas.values())
                if replicas:
                    await asyncio.gather(*(self._scrape(r) for r in replicas))
                    self.scrapes += 1
                    await self.on_change()
                elapsed = time.monotonic() - started
                await asyncio.sleep(max(config.scrape_interval_seconds - elapsed, 0.01))
        finally:
            await self.session.close()

    async def _scrape(self, replica: Replica) -> None:
        assert self.session is not None
        signals: MetricsSnapshot | None = None
        problem = ""
        try:
            async with self.session.get(replica.endpoint.url + endpoints.METRICS) as response:
                if response.status == 200:
                    signals = parse(await response.text())
                else:
                    problem = f"HTTP {response.status}"
        except TimeoutError:
            problem = f"no answer within {self.fleet.config.scrape_timeout_seconds:g} s"
        except (aiohttp.ClientError, BadMetrics, ValueError) as error:
            problem = str(error) or type(error).__name__
        name = replica.endpoint.name
        if signals is None:
            self.metrics.scrape_failures.labels(name).inc()
            if not replica.scrape_failing:
                log.warning(
                    "metrics of %s unreadable (%s): its load counts as unknown (busy)",
                    name,
                    problem[:200],
                )
        elif replica.scrape_failing:
            log.info("metrics of %s readable again", name)
        self.fleet.record_scrape(replica.id, signals, time.monotonic())
