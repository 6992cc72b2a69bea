"""A plain answer's wait goes on while its engine generates, and ends once
a step passes with the engine's counter flat or unknown."""

from __future__ import annotations

from shoal.router.progress import Progress


def waits(readings: list[float | None], *, step: float = 10, deadline: float = 35) -> list[float]:
    """The successive ends of the wait, a look at each (readings[0] at the send)."""
    clock = [0.0]
    seen = iter(readings)
    progress = Progress(
        read=lambda: next(seen), clock=lambda: clock[0], step=step, deadline=deadline
    )
    ends = []
    while (later := progress.extend()) is not None:
        ends.append(later)
        clock[0] = later
    return ends


def test_an_engine_that_generates_is_waited_for_up_to_the_total_deadline() -> None:
    assert waits([0, 5, 9, 20, 30, 40]) == [10, 20, 30, 35]


def test_an_engine_whose_counter_stops_is_given_up_at_the_next_look() -> None:
    assert waits([0, 5, 5]) == [10]
    assert waits([3, 3]) == []


def test_an_engine_whose_counter_is_unknown_is_not_waited_for() -> None:
    # Scrapes failing say nothing of progress: the wait ends as a first byte's would.
    assert waits([None, 5]) == []
    assert waits([0, None, 9]) == []


def test_a_counter_that_went_down_is_a_restarted_engine_not_progress() -> None:
    assert waits([50, 2]) == []
