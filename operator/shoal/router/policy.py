"""Routing policies: pure functions of the replicas' state and the request.

Every policy chooses among *eligible* replicas (routable, breaker closed or
probing, not saturated); None means every replica is saturated and the
request should wait in the admission queue.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.router.config import Policy, RouterConfig
from shoal.router.prefix import rendezvous_score


@dataclass(frozen=True)
class Candidate:
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
    return max(candidates, key=lambda c: rendezvous_score(key, c.replica))


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
            ordered = sorted(eligible, key=lambda c: c.replica)
            pick = ordered[self._next % len(ordered)]
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
        scores = [(hit_weight * c.hit - beta * c.load, c) for c in eligible]
        best = max(score for score, _ in scores)
        tied = [c for score, c in scores if score >= best - self.config.tie_tolerance]
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
        total = sum(c.load for c in eligible) / unit + 1
        capacity = math.ceil((1 + self.config.epsilon) * total / len(eligible))
        bounded = [c for c in eligible if c.load / unit + 1 <= capacity + 1e-9] or [
            min(eligible, key=lambda c: c.load)
        ]
        return self._best(bounded, facts.affinity_key, beta=self.config.beta, reason="cache-aware")
