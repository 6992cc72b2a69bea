"""The router's view of the fleet: replicas as discovery reports them, their
latest scraped signals, own in-flight counts and circuit breakers, and the
prefix index. The request path only reads and updates this memory."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from shoal.router.breaker import CircuitBreaker
from shoal.router.config import RouterConfig
from shoal.router.index import PrefixIndex
from shoal.router.policy import Candidate
from shoal.router.signals import EngineSignals, load_from_inflight, load_from_signals


@dataclass(frozen=True)
class Endpoint:
    """A replica as discovery sees it. `id` is its identity: the pod UID in
    Kubernetes (a restarted pod is a new, cold replica), the URL when static."""

    id: str
    name: str
    url: str
    routable: bool


@dataclass
class Replica:
    endpoint: Endpoint
    breaker: CircuitBreaker
    signals: EngineSignals | None = None
    scraped_at: float | None = None
    inflight: int = 0
    draining: bool = field(default=False)

    @property
    def id(self) -> str:
        return self.endpoint.id


class Fleet:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.replicas: dict[str, Replica] = {}
        self.index = PrefixIndex(blocks_per_replica=config.index_blocks_per_replica)
        self.version = 0  # bumped on any change that can free capacity

    def update(self, endpoints: Iterable[Endpoint]) -> None:
        """Converge on discovery's full list. A replica that is no longer
        listed is dropped; in-flight requests to it finish on their own."""
        seen = set()
        for endpoint in endpoints:
            seen.add(endpoint.id)
            replica = self.replicas.get(endpoint.id)
            if replica is None:
                breaker = CircuitBreaker(
                    failure_threshold=self.config.breaker.failure_threshold,
                    open_seconds=self.config.breaker.open_seconds,
                )
                self.replicas[endpoint.id] = Replica(endpoint=endpoint, breaker=breaker)
                self.index.add_replica(endpoint.id)
            else:
                replica.endpoint = endpoint
        for gone in set(self.replicas) - seen:
            del self.replicas[gone]
            self.index.remove_replica(gone)
        self.version += 1

    def routable(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.endpoint.routable]

    def record_scrape(self, replica_id: str, signals: EngineSignals | None, now: float) -> None:
        replica = self.replicas.get(replica_id)
        if replica is None:
            return
        if signals is not None:
            replica.signals = signals
            replica.scraped_at = now
        self.version += 1

    def fresh(self, replica: Replica, now: float) -> bool:
        return (
            replica.scraped_at is not None
            and now - replica.scraped_at <= self.config.stale_after_seconds
        )

    def candidates(
        self, *, blocks: list[int], exclude: frozenset[str] = frozenset(), now: float | None = None
    ) -> list[Candidate]:
        now = time.monotonic() if now is None else now
        routable = [r for r in self.routable() if r.id not in exclude]
        # Broken metrics everywhere must not become a total outage.
        all_stale = not any(self.fresh(r, now) for r in routable)
        depths = self.index.match(blocks) if blocks else {}
        out = []
        for replica in routable:
            if not replica.breaker.allows(now):
                continue
            if all_stale:
                load = load_from_inflight(inflight=replica.inflight, config=self.config)
            else:
                signals = replica.signals if self.fresh(replica, now) else None
                load = load_from_signals(signals, inflight=replica.inflight, config=self.config)
            hit = depths.get(replica.id, 0) / len(blocks) if blocks else 0.0
            out.append(Candidate(replica.id, load.score, load.saturated, replica.inflight, hit))
        return out
