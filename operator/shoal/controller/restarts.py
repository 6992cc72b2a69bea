"""Restart history in the status, so the restart budget outlives the operator.

The decisions count restarts in monotonic seconds, in process memory; a
restarted operator would forget them and could restart a crash-looping
replica all over again. Each replica's status entry therefore keeps the
wall-clock times of its restarts within the budget's window, and a fresh
operator turns them back into monotonic times before its first decision.
Pure: the clocks come in as arguments.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

# More than any sane restartBudget.maxRestarts; bounds the status entry.
MAX_KEPT = 32
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def wall_seconds(text: str) -> float | None:
    try:
        parsed = datetime.datetime.strptime(text, _FORMAT).replace(tzinfo=datetime.UTC)
    except (TypeError, ValueError):
        return None
    return parsed.timestamp()


def recent_restarts(
    previous: Sequence[Any], restarted_at: str | None, *, now_wall: float, window_seconds: float
) -> list[str]:
    """The entry's restart times still inside the window, plus a new one."""
    kept = [
        t
        for t in previous
        if isinstance(t, str)
        and (seconds := wall_seconds(t)) is not None
        and now_wall - seconds < window_seconds
    ]
    if restarted_at is not None:
        kept.append(restarted_at)
    return kept[-MAX_KEPT:]


def seed_restart_times(
    status: Mapping[str, Any], *, now_wall: float, now_mono: float
) -> dict[int, tuple[float, ...]]:
    """Monotonic restart times per replica from a status written by an
    earlier operator (times in the future, from clock skew, count as now)."""
    seeded: dict[int, tuple[float, ...]] = {}
    for entry in status.get("replicaStatuses") or []:
        index = entry.get("index")
        if not isinstance(index, int):
            continue
        times = []
        for text in entry.get("recentRestartTimes") or []:
            seconds = wall_seconds(text) if isinstance(text, str) else None
            if seconds is not None:
                times.append(now_mono - max(now_wall - seconds, 0.0))
        if times:
            seeded[index] = tuple(sorted(times))
    return seeded
