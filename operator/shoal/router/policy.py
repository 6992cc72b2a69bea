"""Routing policies: pure functions of the replicas' state and the request.

Every policy chooses among *eligible* replicas (routable, breaker closed or
probing, not saturated); None means every replica is saturated and the
request should wait in the admission queue.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from shoal.api.router import RouterPolicy
from shoal.router.config import RouterConfig


class Candidate(NamedTuple):
    # A NamedTuple, not a dataclass: one is built per replica per request,
    # and the decision-time budget is 100 us for 64 replicas.
    replica: str
    load: float  # the load score L, 1.0 when metrics are stale
    saturated: bool
    inflight: int  # this router's requests in flight to it
    hit: float = 0.0  # expected share of the prompt's prefix blocks it holds
    # Prompt tokens this router sent it that it has not prefilled yet (its
    # estimate of their uncached part; a request's share leaves with its
    # first output token). Moves at once, where scraped queues lag a scrape.
    pending: float = 0.0
    # Requests on it: running + waiting as last scraped, or this router's own
    # in-flight count when that is higher (the scrape has not seen them yet).
    requests: float = 0.0


@dataclass(frozen=True)
class RequestFacts:
    affinity_key: int  # hash of the first prefix block (or of the whole short prompt)
    session_key: int | None = None
    prompt_tokens: float = 0.0  # estimated from the rendered prompt's length
    prefix_tokens: float = 0.0  # the part of it the prefix blocks cover


@dataclass(frozen=True)
class Choice:
    replica: str
    predicted_hit: float
    reason: str


def _rendezvous(candidates: Sequence[Candidate], key: int) -> Candidate:
    """The candidate whose id hashes highest under the key's seed. A plain
    loop with a positional seed: a functools.partial with `seed=` builds a
    keyword dict per call and was 3x slower over 64 replicas."""
    digest = xxhash.xxh3_64_intdigest
    seed = key & _MASK64
    best = candidates[0]
    top = -1
    for candidate in candidates:
        score = digest(candidate[0].encode(), seed)
        if score > top:
            top = score
            best = candidate
    return best


# Candidate's fields by position: itemgetter on a tuple is about twice as
# fast as a NamedTuple's attribute, and these run per replica per request.
_LOAD = operator.itemgetter(1)
_SATURATED = operator.itemgetter(2)
_HIT = operator.itemgetter(4)
_REQUESTS = operator.itemgetter(6)
_MASK64 = 0xFFFFFFFFFFFFFFFF


class Chooser:
    """Holds the little state some policies need (round-robin's position, a
    random generator); everything else comes in with each call."""

    def __init__(self, config: RouterConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()
        self._next = 0
        # The others choose without looking at what replicas hold.
        self.weighs_hits = config.policy in (RouterPolicy.PREFIX, RouterPolicy.CACHE_AWARE)

    def choose(self, candidates: Sequence[Candidate], facts: RequestFacts) -> Choice | None:
        eligible = list(itertools.filterfalse(_SATURATED, candidates))
        if not eligible:
            return None
        policy = self.config.policy
        if policy is RouterPolicy.ROUND_ROBIN:
            # Candidates come in the fleet's stable order: no need to sort.
            pick = eligible[self._next % len(eligible)]
            self._next += 1
            return Choice(pick.replica, pick.hit, "round-robin")
        if policy is RouterPolicy.RANDOM:
            pick = self.rng.choice(eligible)
            return Choice(pick.replica, pick.hit, "random")
        if policy is RouterPolicy.LEAST_REQUEST:
            fewest = min(c.inflight for c in eligible)
            pick = self.rng.choice([c for c in eligible if c.inflight == fewest])
            return Choice(pick.replica, pick.hit, "least-request")
        if policy is RouterPolicy.POWER_OF_TWO:
            pair = self.rng.sample(eligible, min(2, len(eligible)))
            pick = min(pair, key=lambda c: c.load)
            return Choice(pick.replica, pick.hit, "power-of-two")
        if policy is RouterPolicy.LOAD_AWARE:
            return self._least_loaded(eligible, facts.affinity_key, "load-aware")
        if policy is RouterPolicy.SESSION:
            return self._session(candidates, eligible, facts) or self._least_loaded(
                eligible, facts.affinity_key, "session-fallback"
            )
        if policy is RouterPolicy.PREFIX:
            return self._best(eligible, facts.affinity_key, beta=0.0, reason="prefix")
        return self._cache_aware(eligible, facts)

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
        tolerance = self.config.thresholds.tie_tolerance
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
        if home in eligible and home.load < self.config.thresholds.affinity_threshold:
            return Choice(home.replica, home.hit, "session")
        return None

    def _cache_aware(self, eligible: Sequence[Candidate], facts: RequestFacts) -> Choice:
        """The replica that will answer first: least prefill work ahead of
        the request's first token, counting what it would have to prefill of
        this prompt (what it does not hold), what it still has to prefill of
        what this router sent it, and a penalty for its scraped load; within
        bounded load. Scores within the tie tolerance go by rendezvous hashing
        of the prompt's first block, so cold prefixes spread evenly and
        routers with slightly different views agree.

        A conversation's own history is its longest prefix, held where its
        previous turn went, so sessions keep their replica through the index
        rather than through a hash of their id (which would copy every shared
        system prompt onto every replica)."""
        config = self.config
        # Bounded load (consistent hashing with bounded loads, counted in
        # requests): a replica may take the request only if, with it, it
        # stays within ceil((1 + epsilon) x the mean). A hot shared prefix
        # therefore spreads over the fleet instead of pinning one replica.
        # Below a few requests a replica is nowhere near busy: keep affinity.
        total = sum(map(_REQUESTS, eligible)) + 1
        capacity = max(
            math.ceil((1 + config.thresholds.epsilon) * total / len(eligible)),
            config.thresholds.bounded_load_min_requests,
        )
        room = capacity - 1
        bounded = [c for c in eligible if c[6] <= room] or [min(eligible, key=_REQUESTS)]
        # Cost in prompt tokens, less the prompt's own length (the same for
        # every replica). Tuple unpacking: attribute access per candidate
        # would cost a third of the decision-time budget at 64 replicas.
        covered = facts.prefix_tokens * config.thresholds.hit_weight
        load_tokens = config.thresholds.beta * config.thresholds.load_tokens
        costs = [
            pending - hit * covered + load_tokens * load
            for _, load, _, _, hit, pending, _ in bounded
        ]
        # Near ties are judged on the scale of the scores: the prompt plus
        # what a full load is worth.
        limit = min(costs) + config.thresholds.tie_tolerance * (
            max(facts.prompt_tokens, 1.0) + load_tokens
        )
        tied = [c for c, cost in zip(bounded, costs, strict=True) if cost <= limit]
        pick = _rendezvous(tied, facts.affinity_key) if len(tied) > 1 else tied[0]
        return Choice(pick.replica, pick.hit, "cache-aware")
