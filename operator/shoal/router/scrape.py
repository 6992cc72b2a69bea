"""Background scraping of every replica's `/metrics`, concurrently, each
under a deadline. The request path never scrapes; it reads the latest
values. A scrape that fails or is not a whole vLLM exposition
(`shoal.engine.metrics.parse`) makes the replica's load unknown (routable,
counted busy: see `fleet`), counts in `shoal_router_scrape_failures_total`,
and logs one WARNING per episode of trouble, slow or failing (and an INFO
line when an answer on time ends it). The fetch stays on aiohttp, the
router's own stack.

Scrapes are the engines' work too (vLLM renders its exposition on its API
server's event loop), so they must not pile up on an engine that is slow:

- a replica has at most one scrape out at a time. One that misses its
  deadline is late, not abandoned: its answer is awaited up to the
  staleness bound, and its replica's last readings stand meanwhile (a
  replica never scraped yet counts as unknown). A late scrape counts as a
  failure and starts a "slow" episode (one WARNING);
- after a late answer a replica waits PACE times as long as that answer
  took before it is scraped again (but no longer than half the staleness
  bound, so its readings are renewed before they go stale): the slower its
  answers, the fewer scrapes it gets, so a CPU-starved engine spends a
  bounded share of its time on one router's scrapes rather than all of it
  (a fixed-rate scraper that abandoned answers at the deadline made two
  routers' scrapes outrun such an engine, which then served nothing). An
  answer on time is followed by the next round's scrape, as before;
- when a round's wait for answers comes back a whole deadline later than
  asked, the router's own event loop was held (a CPU-starved router pod):
  lateness then says nothing about the engines, and nobody is counted late.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from shoal.engine import endpoints
from shoal.engine.errors import BadMetrics
from shoal.engine.metrics import MetricsSnapshot, parse
from shoal.router.fleet import Fleet, Replica
from shoal.router.metrics import RouterMetrics
from shoal.router.reads import read_whole

log = logging.getLogger("shoal.router.scrape")

# After a late answer that took d seconds, a replica is scraped again PACE * d
# later: about 1 / (1 + PACE) of a slow engine's time goes to one router's scrapes.
PACE = 9.0


def next_scrape(*, began: float, ended: float, late: bool, interval: float, stale: float) -> float:
    """When a replica whose last scrape ran from `began` to `ended` may be
    scraped again: at the next round if it answered on time; after a late
    answer, PACE times its duration later, within half the staleness bound."""
    if not late:
        return began + interval
    return ended + max(interval, min(PACE * (ended - began), stale / 2))


def loop_was_late(*, waited: float, deadline: float) -> bool:
    """Whether a wait of `deadline` seconds that took `waited` means the
    router's own event loop was held: it came back more than a whole
    deadline late."""
    return waited > 2 * deadline


@dataclass
class _Target:
    """What the scraper keeps of one replica."""

    task: asyncio.Task[None] | None = None  # the scrape out now
    due: float = 0.0  # when it may be scraped next
    late: bool = False  # the scrape out now missed its deadline
    # An episode of trouble (one WARNING) lasts until an answer on time:
    slow: bool = False  # scrapes miss the deadline
    failing: bool = False  # the latest scrape failed


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
        self.scrapes = 0  # rounds done
        self._targets: dict[str, _Target] = {}

    @property
    def answer_limit(self) -> float:
        """How long a scrape's answer is awaited: past the staleness bound
        it would be stale on arrival."""
        config = self.fleet.config
        return max(config.stale_after_seconds, config.scrape_timeout_seconds)

    async def run(self) -> None:
        config = self.fleet.config
        deadline = config.scrape_timeout_seconds
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.answer_limit))
        try:
            while True:
                started = time.monotonic()
                out = self._start_due(started)
                if out:
                    await asyncio.wait(out, timeout=deadline)
                    waited = time.monotonic() - started
                    if not loop_was_late(waited=waited, deadline=deadline):
                        self._judge_late(out)
                if self.fleet.replicas:
                    self.scrapes += 1
                    await self.on_change()
                elapsed = time.monotonic() - started
                await asyncio.sleep(max(config.scrape_interval_seconds - elapsed, 0.01))
        finally:
            tasks = [t.task for t in self._targets.values() if t.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.session.close()

    def _start_due(self, now: float) -> set[asyncio.Task[None]]:
        """Start a scrape of every replica that has none out and is due."""
        for gone in set(self._targets) - set(self.fleet.replicas):
            task = self._targets.pop(gone).task
            if task is not None:
                task.cancel()
        out: set[asyncio.Task[None]] = set()
        for replica in self.fleet.replicas.values():
            target = self._targets.setdefault(replica.id, _Target())
            if target.task is None and now >= target.due:
                target.late = False
                target.task = asyncio.get_running_loop().create_task(self._scrape(replica, target))
                out.add(target.task)
        return out

    def _judge_late(self, out: set[asyncio.Task[None]]) -> None:
        """The scrapes of this round still out at the deadline are late."""
        now = time.monotonic()
        for replica in self.fleet.replicas.values():
            target = self._targets.get(replica.id)
            if target is None or target.task is None or target.task not in out:
                continue
            if target.task.done():
                continue
            target.late = True
            name = replica.endpoint.name
            self.metrics.scrape_failures.labels(name).inc()
            if not target.slow and not target.failing:
                log.warning(
                    "metrics of %s slow (no answer within %g s): its answer is awaited up to "
                    "%g s, its last readings stand meanwhile (none yet: its load counts as "
                    "unknown), and it is scraped less often",
                    name,
                    self.fleet.config.scrape_timeout_seconds,
                    self.answer_limit,
                )
            target.slow = True
            if replica.scraped_at is None:
                # Never read: routable as unknown rather than left out.
                self.fleet.record_scrape(replica.id, None, now)

    async def _scrape(self, replica: Replica, target: _Target) -> None:
        began = time.monotonic()
        signals, problem = await self._fetch(replica)
        ended = time.monotonic()
        target.task = None
        config = self.fleet.config
        target.due = next_scrape(
            began=began,
            ended=ended,
            late=target.late,
            interval=config.scrape_interval_seconds,
            stale=config.stale_after_seconds,
        )
        name = replica.endpoint.name
        if signals is None:
            if not target.late:  # a late one was counted at its deadline
                self.metrics.scrape_failures.labels(name).inc()
            # One warning per episode, and a late answer that then fails says
            # why too (an endless one cut at its size, a hang at the limit).
            if not target.failing:
                log.warning(
                    "metrics of %s unreadable (%s): its load counts as unknown (busy)",
                    name,
                    problem[:200],
                )
            target.failing = True
        else:
            if not target.late and (target.failing or target.slow):
                log.info("metrics of %s readable on time again", name)
            target.slow = target.late  # only an answer on time ends an episode
            target.failing = False
        self.fleet.record_scrape(replica.id, signals, ended)

    async def _fetch(self, replica: Replica) -> tuple[MetricsSnapshot | None, str]:
        """The replica's signals, or None and what went wrong."""
        assert self.session is not None
        try:
            async with self.session.get(replica.endpoint.url + endpoints.METRICS) as response:
                if response.status != 200:
                    return None, f"HTTP {response.status}"
                raw = await read_whole(response, limit=endpoints.MAX_ANSWER_BYTES)
                return parse(raw.decode("utf-8", "replace")), ""
        except TimeoutError:
            return None, f"no answer within {self.answer_limit:g} s"
        except (aiohttp.ClientError, BadMetrics, ValueError) as error:
            return None, str(error) or type(error).__name__
