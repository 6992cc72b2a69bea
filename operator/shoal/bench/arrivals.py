"""When each request of an open-loop run is sent.

As `vllm bench serve` does it: gaps drawn from a gamma distribution with
shape `burstiness` and mean 1 / rate. Burstiness 1 is a Poisson process;
below 1 requests come in bursts with quiet spells between them, above 1
they come more evenly. Seeded apart from the workload, so the same prompts
can be replayed at several rates.
"""

from __future__ import annotations

import random


def arrival_offsets(
    count: int, *, rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Seconds from the start at which each of `count` requests is sent;
    the first goes at once."""
    if rate <= 0:
        raise ValueError("the request rate must be above 0")
    if burstiness <= 0:
        raise ValueError("burstiness must be above 0")
    rng = random.Random(f"{seed}-arrivals")
    theta = 1.0 / (rate * burstiness)
    offsets = []
    at = 0.0
    for i in range(count):
        if i:
            at += rng.gammavariate(burstiness, theta)
        offsets.append(at)
    return offsets
