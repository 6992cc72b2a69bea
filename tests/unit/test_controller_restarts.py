"""The restart history that the status carries across operator restarts."""

from __future__ import annotations

from shoal.controller.decide import HealPolicy, restart_wait
from shoal.controller.restarts import (
    MAX_KEPT,
    recent_restarts,
    seed_restart_times,
    wall_seconds,
)

NOW = "2026-11-30T10:00:00Z"
POLICY = HealPolicy(
    backoff_initial_seconds=10,
    backoff_max_seconds=300,
    max_restarts=3,
    window_seconds=600,
)


def test_the_status_keeps_restarts_inside_the_window_and_adds_the_new_one() -> None:
    now = wall_seconds(NOW)
    assert now is not None
    previous = ["2026-11-30T09:45:00Z", "2026-11-30T09:55:00Z", "garbage", 7]
    kept = recent_restarts(previous, NOW, now_wall=now, window_seconds=600)
    assert kept == ["2026-11-30T09:55:00Z", NOW]  # 09:45 is 15 min old
    assert recent_restarts(previous, None, now_wall=now, window_seconds=600) == [
        "2026-11-30T09:55:00Z"
    ]
    many = [NOW] * (MAX_KEPT + 5)
    assert len(recent_restarts(many, NOW, now_wall=now, window_seconds=600)) == MAX_KEPT


def test_a_new_operator_counts_the_restarts_an_earlier_one_made() -> None:
    now = wall_seconds(NOW)
    assert now is not None
    status = {
        "replicaStatuses": [
            {
                "index": 0,
                "recentRestartTimes": [
                    "2026-11-30T09:58:00Z",
                    "2026-11-30T09:59:00Z",
                    "2026-11-30T09:59:30Z",
                ],
            },
            {"index": 1, "recentRestartTimes": ["2026-11-30T09:59:50Z", "bad"]},
            {"index": 2},
        ]
    }
    seeded = seed_restart_times(status, now_wall=now, now_mono=1000.0)
    assert seeded == {0: (880.0, 940.0, 970.0), 1: (990.0,)}
    # Replica 0 spent its budget of 3 in the window: a fresh operator still
    # must not restart it; replica 1 waits out its backoff from 10 s ago.
    assert restart_wait(seeded[0], POLICY, now=1000.0) is None
    assert restart_wait(seeded[1], POLICY, now=1000.0) == 0.0
    assert restart_wait(seeded[1], POLICY, now=995.0) == 5.0
