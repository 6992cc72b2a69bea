"""Routing policies: pure functions of the replicas' state and the request.

Every policy chooses among *eligible* replicas (routable, breaker closed or
probing, not saturated); None means every replica is saturated and the
request should wait in the admission queue.
"""

from __future__ import annotations

import functools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from shoal.router.config import Policy, RouterConfig


class Candidate(NamedTuple):
    # A NamedTuple, not a dataclass: one is built per replica per request,
    # and the decision-time budget is 100 us for 64 replicas.
    replica: str
    load: float  # the load score L, 1.0 when metrics are stale
    saturated: bool
    inflight: int
    hit: float = 0.0  # expected share of the prompt's prefix blocks it holds


@dataclass(frozen=True)
class RequestFacts:
    affinity_key: int  # hash of the first prefix block (or of the whole short prompt)
    session_key: int | None = None


@dataclass(frozen=True)
class Choice:
    replica: str
    predicted_hit: float
    reason: str


def _rendezvous(candidates: Sequence[Candidate], key: int) -> Candidate:
    # C-level loops (map, max over indices): this runs for most requests, over
    # up to the whole fleet, within the decision-time budget.
    score = functools.partial(xxhash.xxh3_64_intdigest, seed=key & _MASK64)
    scores = list(map(score, map(str.encode, map(_REPLICA, candidates))))
    return candidates[max(range(len(scores)), key=scores.__getitem__)]


_REPLICA = operator.attrgetter("replica")
_LOAD = operator.attrgetter("load")
_HIT = operator.attrgetter("hit")
_MASK64 = 0xFFFFFFFFFFFFFFFF


class Chooser:
    """Holds the little state some policies need (round-robin's position, a
    random generator); everything else comes in with each call."""

    def __init__(self, config: RouterConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()
        self._next = 0

    def choose(self, candidates: Sequence[Candidate], facts: RequestFacts) -> Choice | None:
        eligible = [c for c in candidates if not c.saturated]
        if not eligible:
            return None
        policy = self.config.policy
        if policy is Policy.ROUND_ROBIN:
            # Candidates come in the fleet's stable order: no need to sort.
            pick = eligible[self._next % len(eligible)]
            self._next += 1
            return Choice(pick.replica, pick.hit, "round-robin")
        if policy is Policy.RANDOM:
            pick = self.rng.choice(eligible)
            return Choice(pick.replica, pick.hit, "random")
        if policy is Policy.LEAST_REQUEST:
            fewest = min(c.inflight for c in eligible)
            pick = self.rng.choice([c for c in eligible if c.inflight == fewest])
            return Choice(pick.replica, pick.hit, "least-request")
        if policy is Policy.POWER_OF_TWO:
            pair = self.rng.sample(eligible, min(2, len(eligible)))
            pick = min(pair, key=lambda c: c.load)
            return Choice(pick.replica, pick.hit, "power-of-two")
        if policy is Policy.LOAD_AWARE:
            return self._least_loaded(eligible, facts.affinity_key, "load-aware")
        if policy is Policy.SESSION:
            return self._session(candidates, eligible, facts) or self._least_loaded(
                eligible, facts.affinity_key, "session-fallback"
            )
        if policy is Policy.PREFIX:
            return self._best(eligible, facts.affinity_key, beta=0.0, reason="prefix")
        return self._cache_aware(candidates, eligible, facts)

    def _least_loaded(self, eligible: Sequence[Candidate], key: int, reason: str) -> Choice:
        return self._best(eligible, key, beta=1.0, reason=reason, hit_weight=0.0)

    def _best(
        self,
        eligible: Sequence[Candidate],
        key: int,
        *,
        beta: float,
        reason: str,
        hit_weight: float = 1.0,
    ) -> Choice:
        """argmax(hit - beta * load); near-ties go by rendezvous hashing."""
        tolerance = self.config.tie_tolerance
        if hit_weight == 0 or not any(map(_HIT, eligible)):
            # Cold prefix (the common case for new prompts): scores are -beta * load.
            if beta == 0:
                tied = list(eligible)
            else:
                limit = min(map(_LOAD, eligible)) + tolerance / beta
                tied = [c for c in eligible if c.load <= limit]
        else:
            scores = [hit_weight * c.hit - beta * c.load for c in eligible]
            floor = max(scores) - tolerance
            tied = [c for c, score in zip(eligible, scores, strict=True) if score >= floor]
        pick = _rendezvous(tied, key) if len(tied) > 1 else tied[0]
        return Choice(pick.replica, pick.hit, reason)

    def _session(
        self, candidates: Sequence[Candidate], eligible: Sequence[Candidate], facts: RequestFacts
    ) -> Choice | None:
        """Soft affinity: the session's rendezvous replica while its load is
        below the threshold."""
        if facts.session_key is None:
            return None
        home = _rendezvous(candidates, facts.session_key)
        if home in eligible and home.load < self.config.affinity_threshold:
            return Choice(home.replica, home.hit, "session")
        return None

    def _cache_aware(
        self, candidates: Sequence[Candidate], eligible: Sequence[Candidate], facts: RequestFacts
    ) -> Choice:
        if (session := self._session(candidates, eligible, facts)) is not None:
            return session
        # Bounded load (consistent hashing with bounded loads, counted in units
        # of one request's load): a replica may take the request only if, with
        # it, it stays within ceil((1 + epsilon) x the mean). A hot shared
        # prefix therefore spreads over the fleet instead of pinning one replica.
        unit = self.config.weights.running / self.config.max_num_seqs
        total = sum(map(_LOAD, eligible)) / unit + 1
        # Below a few requests a replica is nowhere near busy (and its scraped
        # counts lag by a scrape interval): keep affinity there.
        capacity = max(
            math.ceil((1 + self.config.epsilon) * total / len(eligible)),
            self.config.bounded_load_min_requests,
        )
        limit = (capacity - 1) * unit + 1e-12
        bounded = [c for c in eligible if c.load <= limit] or [min(eligible, key=_LOAD)]
        return self._best(bounded, facts.affinity_key, beta=self.config.beta, reason="cache-aware")
