"""The router's view of the fleet: replicas as discovery reports them, their
latest scraped signals, own in-flight counts and circuit breakers, and the
prefix index.

The request path only reads memory, and must decide in well under 100 us for
64 replicas. So each replica's policy view (a Candidate: load score,
saturation, in-flight count) is recomputed only after something it depends
on changed (a scrape, a request starting or ending, a breaker transition,
discovery), at the next decision, however many changes came between; a
request only adds its prefix hits.
Time-based changes (metrics going stale, an open breaker turning half-open,
recent errors fading) are swept on every scrape round (default every 250 ms).

A replica whose metrics cannot be read (a failing, hanging or unparseable
scrape, or none for a while) has an unknown load: it stays routable and
counts as busy, never as idle, so broken metrics alone neither take it out
of rotation nor draw traffic to it. Its recent error rate adds to its load
score, so a replica failing fast never looks idle either; except once its
breaker is half-open, so that its probe is sent (a probe that answers in
full clears the rate).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shoal.engine.metrics import MetricsSnapshot
from shoal.router.breaker import CircuitBreaker, Outcome
from shoal.router.config import RouterConfig
from shoal.router.index import PrefixIndex
from shoal.router.policy import Candidate, Choice, Chooser, RequestFacts
from shoal.router.prefix import PrefixKey
from shoal.router.signals import Load, load_from_inflight, load_from_signals, load_unknown

# Recent errors: each attempt's outcome moves a replica's error rate this far
# towards 1 (failed) or 0 (answered), and the rate halves every
# ERROR_HALF_LIFE seconds, so a replica that stopped failing is trusted again
# even while it gets little traffic.
ERROR_WEIGHT = 0.2
ERROR_HALF_LIFE = 10.0


@dataclass(frozen=True)
class Endpoint:
    """A replica as discovery sees it. `id` is its identity: the pod UID in
    Kubernetes (a restarted pod is a new, cold replica), the URL when static."""

    id: str
    name: str
    url: str
    routable: bool


@dataclass(slots=True)
class Replica:
    endpoint: Endpoint
    breaker: CircuitBreaker
    id: str = ""
    signals: MetricsSnapshot | None = None
    scraped_at: float | None = None
    inflight: int = 0
    pending: float = 0.0  # estimated prompt tokens sent and not yet prefilled
    foreign: float = 0.0  # the same, sent by the other router replicas (as they said)
    errors: float = 0.0  # recent error rate, 0 to 1
    scrape_failing: bool = False  # the latest scrape failed: load unknown
    key: int = 0  # which of the router's engine keys it is sent (Proxy.engine_keys)

    def __post_init__(self) -> None:
        self.id = self.endpoint.id

    def progress(self) -> float | None:
        """The engine's progress counter as last scraped (None: unknown)."""
        if self.signals is None or self.scrape_failing:
            return None
        return self.signals.progress


class Fleet:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.replicas: dict[str, Replica] = {}
        self.index = PrefixIndex(blocks_per_replica=config.thresholds.index_blocks_per_replica)
        self._views: dict[str, Candidate] = {}  # routable replicas whose breaker admits
        # Replicas whose view changed since the last decision: recomputed when
        # the next one reads them, once however many requests began or ended.
        self._changed: set[str] = set()
        self._all_stale = True
        self._swept = time.monotonic()
        # What each peer router said it has pending, per replica (placements.py).
        self._foreign: dict[str, dict[str, float]] = {}
        self.on_prefilled: Callable[[], None] | None = None  # tells the peers

    # ---- changes
    def update(self, endpoints: Iterable[Endpoint]) -> None:
        """Converge on discovery's full list. A replica that is no longer
        listed is dropped; in-flight requests to it finish on their own."""
        seen = set()
        for endpoint in endpoints:
            seen.add(endpoint.id)
            replica = self.replicas.get(endpoint.id)
            if replica is None:
                timeouts = self.config.timeouts
                breaker = CircuitBreaker(
                    failure_threshold=self.config.circuit_breaker.failure_threshold,
                    open_seconds=self.config.circuit_breaker.open_seconds,
                    # The longest a probe can take to answer or fail.
                    probe_seconds=timeouts.connect_seconds + timeouts.first_byte_seconds,
                )
                self.replicas[endpoint.id] = Replica(endpoint=endpoint, breaker=breaker)
                self.index.add_replica(endpoint.id)
            else:
                replica.endpoint = endpoint
        for gone in set(self.replicas) - seen:
            del self.replicas[gone]
            self.index.remove_replica(gone)
        self.sweep(time.monotonic())

    def record_scrape(self, replica_id: str, signals: MetricsSnapshot | None, now: float) -> None:
        replica = self.replicas.get(replica_id)
        if replica is None:
            return
        if signals is not None:
            replica.signals = signals
            replica.scraped_at = now
        replica.scrape_failing = signals is None

    def sweep(self, now: float) -> None:
        """Recompute every replica's view: after a scrape round, on discovery
        changes, and so staleness, half-open breakers and fading errors take
        effect."""
        fade = 0.5 ** ((now - self._swept) / ERROR_HALF_LIFE)
        self._swept = now
        for replica in self.replicas.values():
            replica.errors *= fade
        routable = self.routable()
        self._all_stale = not any(self.fresh(r, now) for r in routable)
        self._views = {}
        self._changed.clear()
        for replica in routable:
            self._view(replica, now)

    def begin(self, replica: Replica, *, prefill_tokens: float = 0.0) -> int:
        """A request was sent to replica, with about `prefill_tokens` of its
        prompt not cached there. Returns the attempt's breaker ticket, for
        `verdict`."""
        replica.inflight += 1
        replica.pending += prefill_tokens
        now = time.monotonic()
        ticket = replica.breaker.start(now)
        self._changed.add(replica.id)
        return ticket

    def prefilled(self, replica: Replica, tokens: float) -> None:
        """A request's first output arrived: its prompt is no longer ahead of
        anything on that replica."""
        # max(): float sums drift, and a negative queue would attract traffic.
        replica.pending = max(replica.pending - tokens, 0.0)
        self._changed.add(replica.id)
        if self.on_prefilled is not None:
            self.on_prefilled()

    def foreign_pending(self, peer: str, pending: dict[str, float]) -> None:
        """What one peer router has sent each replica and not seen prefilled yet,
        replacing what it said before ({} when it is gone)."""
        before = self._foreign.pop(peer, {})
        if pending:
            self._foreign[peer] = pending
        for replica_id in before.keys() | pending.keys():
            replica = self.replicas.get(replica_id)
            if replica is None:
                continue
            replica.foreign = sum(said.get(replica_id, 0.0) for said in self._foreign.values())
            self._changed.add(replica_id)

    def verdict(self, replica: Replica, ticket: int, outcome: Outcome) -> None:
        """What an attempt (its ticket from `begin`) says about its replica.
        Every attempt gives one before its `end`, Outcome.NONE when nothing:
        so a half-open probe always frees its slot."""
        if outcome is Outcome.OK:
            replica.errors -= ERROR_WEIGHT * replica.errors
        elif outcome is Outcome.FAILED:
            replica.errors += ERROR_WEIGHT * (1.0 - replica.errors)
        replica.breaker.finish(ticket, outcome, time.monotonic())
        if outcome is not Outcome.NONE:
            # Its end may be a while off (an error body still read, a stream
            # still sent): decisions meanwhile see what this one says.
            self._changed.add(replica.id)

    def recheck(self) -> None:
        """Every replica's breaker is tried again at once: the failures it
        counted (an engine refusing the router's key) may not hold now."""
        now = time.monotonic()
        for replica in self.replicas.values():
            replica.breaker.recheck(now)
        self.sweep(now)

    def end(self, replica: Replica, ticket: int) -> None:
        """A request to replica (its ticket from `begin`) ended."""
        if replica.breaker.passed(ticket):
            # The probe answered in full: the failures it was probing for are
            # over, and the replica is as trusted as its peers.
            replica.errors = 0.0
        replica.inflight -= 1
        self._changed.add(replica.id)

    def _review(self, now: float) -> None:
        """Recompute the views of the replicas that changed since the last decision."""
        for replica_id in self._changed:
            changed = self.replicas.get(replica_id)
            if changed is None:
                self._views.pop(replica_id, None)
            else:
                self._view(changed, now)
        self._changed.clear()

    def _view(self, replica: Replica, now: float) -> None:
        if not replica.endpoint.routable:
            self._views.pop(replica.id, None)
            return
        if not replica.breaker.allows(now):
            self._views.pop(replica.id, None)
            return
        load = self._load(replica, now)
        # A half-open replica is judged by its load alone: its error rate is
        # what opened the breaker, and would keep the probe away (at light
        # load nothing spills onto it) until it had faded.
        errors = replica.errors if replica.breaker.opened_at is None else 0.0
        self._views[replica.id] = Candidate(
            replica.id,
            load.score + errors,
            load.saturated,
            replica.inflight,
            0.0,
            replica.pending + replica.foreign,
            max(load.requests, replica.inflight),
        )

    def _load(self, replica: Replica, now: float) -> Load:
        if self._all_stale:
            # Nobody's load is known: route on own in-flight counts.
            return load_from_inflight(inflight=replica.inflight, config=self.config)
        if replica.scraped_at is None and not replica.scrape_failing:
            # Its first scrape round is still out: not yet a candidate.
            return load_from_signals(None, inflight=replica.inflight, config=self.config)
        if not self.fresh(replica, now):
            return load_unknown(inflight=replica.inflight, config=self.config)
        return load_from_signals(replica.signals, inflight=replica.inflight, config=self.config)

    # ---- reads
    def routable(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.endpoint.routable]

    def fresh(self, replica: Replica, now: float) -> bool:
        return (
            replica.scraped_at is not None
            and not replica.scrape_failing
            and now - replica.scraped_at <= self.config.stale_after_seconds
        )

    def decide(
        self,
        chooser: Chooser,
        key: PrefixKey,
        facts: RequestFacts,
        *,
        exclude: frozenset[str] = frozenset(),
    ) -> tuple[Choice | None, bool]:
        """The chooser's pick, and whether there was anyone to pick from.
        The prompt is matched against every replica only for the policies
        that weigh hits; for the rest only against the chosen one (for its
        prefill estimate and the predicted-hit metric)."""
        weighs = chooser.weighs_hits
        candidates = self.candidates(key=key if weighs else None, exclude=exclude)
        choice = chooser.choose(candidates, facts)
        if choice is not None and not weighs and key.hashes:
            hit = key.held_share(self.index.depth(choice.replica, key.hashes))
            choice = Choice(choice.replica, hit, choice.reason)
        return choice, bool(candidates)

    def candidates(
        self, *, key: PrefixKey | None, exclude: frozenset[str] = frozenset()
    ) -> list[Candidate]:
        """The replicas a request may go to, with the share of its prefix
        blocks each is believed to hold."""
        if self._changed:
            self._review(time.monotonic())
        views = self._views
        depths = self.index.match(key.hashes) if key is not None and key.hashes else None
        if depths:
            assert key is not None
            # Only the replicas holding some of the prompt change: a copy of
            # the views with those replaced (a pass over all 64 in Python
            # would cost twice as much).
            views = dict(views)
            for replica, depth in depths.items():
                c = views.get(replica)
                if c is not None:
                    views[replica] = Candidate(
                        replica, c[1], c[2], c[3], key.held_share(depth), c[5], c[6]
                    )
        if exclude:
            return [c for r, c in views.items() if r not in exclude]
        return list(views.values())
