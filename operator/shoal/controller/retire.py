"""Which replicas a fleet keeps when it shrinks or grows. Pure.

A replica keeps its index (its StatefulSets' names, its pods' DNS names) for
life, so a fleet scaled down need not be indices 0..n-1: the replicas kept
are the ones that exist, and a scale-down removes, first, those in the
cluster's removal order (`ANNOTATION_REMOVAL_ORDER`, which the autoscaler
writes before it scales down), then those not serving, then the highest
indices (a `kubectl scale` down). A scale-up adds the lowest free indices;
a replica still draining is kept again before any new one is made (it is
warm).

`removal_order` ranks replicas by what their loss costs: a replica not
serving (starting, warming, held, draining) costs nothing; then the fewest
requests in flight at the routers; ties go to the highest index. The routers
do not export which hot prefixes each replica alone holds, so that cost is
not ranked on (docs/autoscaling.md)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.api.status import ReplicaState
from shoal.controller.names import leader_pod_name


@dataclass(frozen=True, kw_only=True)
class ReplicaLoad:
    """A replica as the autoscaler sees it when it scales down."""

    index: int
    serving: bool  # warm and Ready: it takes traffic
    in_flight: float  # requests in flight to it, summed over the routers


def replica_loads(
    statuses: Iterable[Mapping[str, Any]], in_flight: Mapping[str, float], *, cluster: str
) -> list[ReplicaLoad]:
    """The replicas of status.replicaStatuses, with the routers' in-flight
    counts (by leader pod name, as the routers label them)."""
    return [
        ReplicaLoad(
            index=int(entry["index"]),
            serving=_state(entry.get("state")) is ReplicaState.SERVING,
            in_flight=in_flight.get(leader_pod_name(cluster, int(entry["index"])), 0.0),
        )
        for entry in statuses
        if isinstance(entry.get("index"), int)
    ]


def _state(text: Any) -> ReplicaState | None:
    try:
        return ReplicaState(text)
    except ValueError:
        return None


def removal_order(replicas: Iterable[ReplicaLoad]) -> list[int]:
    """Indices, the cheapest loss first."""
    ranked = sorted(replicas, key=lambda r: (r.serving, r.in_flight, -r.index))
    return [r.index for r in ranked]


def not_serving_first(serving: Mapping[int, bool]) -> list[int]:
    """Of replicas by index (True: it serves), those not serving, the highest
    first: the order a scale-down without the autoscaler's removes them in."""
    return sorted((i for i, serves in serving.items() if not serves), reverse=True)


def kept_indices(*, count: int, existing: Collection[int], order: Sequence[int]) -> list[int]:
    """The `count` replica indices to keep (sorted), given those that exist and
    the removal order (indices, first removed first; may name gone ones)."""
    have = set(existing)
    if len(have) <= count:
        free = (i for i in range(count + len(have)) if i not in have)
        return sorted(have | {next(free) for _ in range(count - len(have))})
    ranked = [i for i in dict.fromkeys(order) if i in have]
    ranked += sorted(have - set(ranked), reverse=True)
    removed = set(ranked[: len(have) - count])
    return sorted(have - removed)


def parse_order(text: str | None) -> tuple[int, ...]:
    """The annotation's indices; what is not a non-negative integer is skipped."""
    found = []
    for part in (text or "").split(","):
        part = part.strip()
        if part.isdigit():
            found.append(int(part))
    return tuple(found)


def order_text(order: Sequence[int]) -> str:
    return ",".join(str(i) for i in order)
