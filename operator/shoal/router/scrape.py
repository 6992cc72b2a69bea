"""Background scraping of every replica's `/metrics`, concurrently, each
under a deadline. The request path never scrapes; it reads the latest
values. A failed scrape leaves the old values to go stale, and stale
metrics count as full load, as does a scrape that is not a whole vLLM
exposition (`shoal.engine.metrics.parse`). The fetch stays on aiohttp, the
router's own stack."""

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

log = logging.getLogger("shoal.router.scrape")


class Scraper:
    def __init__(self, *, fleet: Fleet, on_change: Callable[[], Awaitable[None]]) -> None:
        self.fleet = fleet
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
        try:
            async with self.session.get(replica.endpoint.url + endpoints.METRICS) as response:
                if response.status == 200:
                    signals = parse(await response.text())
        except (aiohttp.ClientError, TimeoutError, BadMetrics, ValueError) as error:
            log.debug("scrape of %s failed: %s", replica.endpoint.name, error)
        self.fleet.record_scrape(replica.id, signals, time.monotonic())
