"""Replicas' error rates through the router, read from the routers' own
counters (`shoal_router_requests_total{replica, code}`). Pure: parse one
router's `/metrics`, and turn successive scrapes of each router pod into what
each replica answered between them.

A router counts a request under the replica that answered it, by HTTP code;
answers of the router itself are under replica "none" and a client that went
away is code 499: neither says anything of a replica. Requests a router
retried elsewhere (connection errors, 502/503 before any byte) are not counted
per replica by the router; the operator's own checks see those engines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from shoal.router.metrics import REQUESTS as ROUTER_REQUESTS
from shoal.router.metrics import read_samples

NO_REPLICA = "none"
CLIENT_GONE = "499"


@dataclass(frozen=True)
class Routed:
    """Requests a replica answered through the router, and how many were 5xx."""

    requests: float = 0.0
    errors: float = 0.0

    @property
    def rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def __add__(self, other: Routed) -> Routed:
        return Routed(self.requests + other.requests, self.errors + other.errors)

    def __sub__(self, other: Routed) -> Routed:
        return Routed(self.requests - other.requests, self.errors - other.errors)


def parse_router_requests(text: str) -> dict[str, Routed]:
    """Per replica (the router's label: the pod name), what it answered so far.
    ValueError when the text is not Prometheus text."""
    wanted = "\n".join(
        line
        for line in text.splitlines()
        if line.startswith(ROUTER_REQUESTS) or ROUTER_REQUESTS + " " in line[:60]
    )
    found: dict[str, Routed] = {}
    for sample in read_samples(wanted + "\n"):
        if sample.name != ROUTER_REQUESTS + "_total":
            continue  # _created
        replica, code = sample.labels.get("replica", ""), sample.labels.get("code", "")
        if replica in ("", NO_REPLICA) or code == CLIENT_GONE:
            continue
        errors = sample.value if code.startswith("5") else 0.0
        found[replica] = summed = found.get(replica, Routed()) + Routed(sample.value, errors)
        if not math.isfinite(summed.requests):  # inf - inf would be NaN next round
            raise ValueError(f"{sample.name} of {replica} sum past the largest float")
    return found


@dataclass
class RouterErrorWindow:
    """The last counts seen of each router pod; each round, what every replica
    answered since the round before, summed over the router pods."""

    _last: dict[str, dict[str, Routed]] = field(default_factory=dict)

    def advance(self, scrapes: Mapping[str, Mapping[str, Routed] | None]) -> dict[str, Routed]:
        """scrapes: the current router pods (by uid), each with its counts, or
        None when its scrape failed (its last counts are kept, so the next
        scrape covers both rounds). A pod seen for the first time sets its
        baseline and adds nothing; a counter that went down (the router's
        process restarted) counts from zero, as Prometheus' rate() does."""
        increase: dict[str, Routed] = {}
        for uid, counts in scrapes.items():
            if counts is None:
                continue
            before = self._last.get(uid)
            self._last[uid] = dict(counts)
            if before is None:
                continue
            for replica, now in counts.items():
                was = before.get(replica, Routed())
                reset = now.requests < was.requests or now.errors < was.errors
                moved = now if reset else now - was
                if moved.requests > 0:
                    increase[replica] = increase.get(replica, Routed()) + moved
        for uid in [u for u in self._last if u not in scrapes]:
            del self._last[uid]
        return increase
