"""Leader election's rules (shoal.controller.election), as client-go's."""

from __future__ import annotations

import datetime

from shoal.controller.election import (
    LEASE_SECONDS,
    RENEW_DEADLINE_SECONDS,
    Record,
    claimed,
    held_by_other,
    micro_time,
    record_of,
)

NOW = "2026-12-06T17:00:00.000000Z"
HELD = Record(holder="a", duration=15, acquired="t0", renewed="t1", transitions=2)


def test_the_charts_empty_lease_is_free_with_the_default_duration() -> None:
    record = record_of({"metadata": {"name": "shoal"}})
    assert record == Record(
        holder="", duration=LEASE_SECONDS, acquired=None, renewed=None, transitions=0
    )
    assert not held_by_other(record, me="b", unchanged_for=0)


def test_another_holder_keeps_it_until_unrenewed_for_its_own_duration() -> None:
    assert held_by_other(HELD, me="b", unchanged_for=14.9)
    assert not held_by_other(HELD, me="b", unchanged_for=15)
    # Its own duration, not ours: a holder that asked for longer gets longer.
    longer = Record(holder="a", duration=60, acquired=None, renewed=None, transitions=0)
    assert held_by_other(longer, me="b", unchanged_for=30)


def test_our_own_or_a_released_lease_is_never_held_by_another() -> None:
    assert not held_by_other(HELD, me="a", unchanged_for=0)
    released = Record(holder="", duration=1, acquired="t0", renewed="t1", transitions=2)
    assert not held_by_other(released, me="b", unchanged_for=0)


def test_taking_it_over_counts_a_transition_and_renewing_keeps_the_acquire_time() -> None:
    taken = claimed(HELD, me="b", now=NOW)
    assert taken == {
        "holderIdentity": "b",
        "leaseDurationSeconds": LEASE_SECONDS,
        "acquireTime": NOW,
        "renewTime": NOW,
        "leaseTransitions": 3,
    }
    renewed = claimed(HELD, me="a", now=NOW)
    assert (renewed["acquireTime"], renewed["renewTime"], renewed["leaseTransitions"]) == (
        "t0",
        NOW,
        2,
    )
    assert claimed(None, me="a", now=NOW)["leaseTransitions"] == 0


def test_the_holder_gives_up_before_a_candidate_may_take_it() -> None:
    assert RENEW_DEADLINE_SECONDS < LEASE_SECONDS


def test_times_are_written_as_kubernetes_micro_time_in_utc() -> None:
    at = datetime.datetime(
        2026, 12, 6, 18, 0, 1, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    assert micro_time(at) == "2026-12-06T17:00:01.000005Z"
