"""The circuit breaker as a state machine, on plain data:

- consecutive failures open it; openSeconds later one probe is let through;
- the probe's answer closes it, its failure re-opens it, and a probe that
  ends without a verdict (cancelled, its client gone) or outlives
  probeSeconds frees the slot for the next request;
- only attempts started in the current state move it: a success that began
  before it opened does not close it, failures from before it closed do not
  reopen it;
- a recheck (the router's engine key changed) half-opens it at once and
  forgets the failures counted before it;
- property: whatever happens, a replica whose engine answers is routable
  again within openSeconds + probeSeconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.router.breaker import CircuitBreaker, CircuitState, Outcome

OK, FAILED, NONE = Outcome.OK, Outcome.FAILED, Outcome.NONE


def opened(*, at: float = 0.0) -> CircuitBreaker:
    breaker = CircuitBreaker(failure_threshold=2, open_seconds=10, probe_seconds=60)
    for _ in range(2):
        breaker.finish(breaker.start(at), FAILED, at)
    assert breaker.state(at) is CircuitState.OPEN
    return breaker


# (what happens, then the state and whether a request may go) — each row
# starts from a breaker opened at t=0 with threshold 2 and openSeconds 10.
TABLE = [
    ("still open before openSeconds", [], 9.9, CircuitState.OPEN, False),
    ("half-open after openSeconds", [], 10.0, CircuitState.HALF_OPEN, True),
    ("one probe at a time", [("probe", None)], 10.5, CircuitState.HALF_OPEN, False),
    ("the probe answers: closed", [("probe", OK)], 10.5, CircuitState.CLOSED, True),
    ("the probe fails: open again", [("probe", FAILED)], 15.0, CircuitState.OPEN, False),
    ("reopened for openSeconds", [("probe", FAILED)], 20.2, CircuitState.HALF_OPEN, True),
    (
        "a probe without verdict frees the slot",
        [("probe", NONE)],
        10.5,
        CircuitState.HALF_OPEN,
        True,
    ),
    ("a probe that never ends is forgotten", [("probe", None)], 70.3, CircuitState.HALF_OPEN, True),
    ("an older attempt's success does not close", [("old", OK)], 5.0, CircuitState.OPEN, False),
    (
        "nor does it take the probe's slot",
        [("probe", None), ("old", OK)],
        10.5,
        CircuitState.HALF_OPEN,
        False,
    ),
]


@pytest.mark.parametrize(
    ("events", "at", "state", "allows"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_breaker_transitions(
    events: list[tuple[str, Outcome | None]], at: float, state: CircuitState, allows: bool
) -> None:
    breaker = CircuitBreaker(failure_threshold=2, open_seconds=10, probe_seconds=60)
    old = breaker.start(0.0)  # in flight since before it opened
    for _ in range(2):
        breaker.finish(breaker.start(0.0), FAILED, 0.0)
    for kind, outcome in events:
        if kind == "old":
            assert outcome is not None
            breaker.finish(old, outcome, 10.2)
        else:
            ticket = breaker.start(10.2)
            if outcome is not None:
                breaker.finish(ticket, outcome, 10.2)
    assert (breaker.state(at), breaker.allows(at)) == (state, allows)


def test_failures_from_before_it_closed_do_not_reopen_it() -> None:
    breaker = opened()
    stale = [breaker.start(1.0) for _ in range(3)]  # not allowed, but started (a race)
    breaker.finish(breaker.start(10.0), OK, 10.0)
    for ticket in stale:
        breaker.finish(ticket, FAILED, 11.0)
    assert breaker.state(11.0) is CircuitState.CLOSED


def test_a_success_resets_the_count_of_consecutive_failures() -> None:
    breaker = CircuitBreaker(failure_threshold=2, open_seconds=10)
    breaker.finish(breaker.start(0), FAILED, 0)
    breaker.finish(breaker.start(0), OK, 0)
    breaker.finish(breaker.start(0), FAILED, 0)
    assert breaker.state(0) is CircuitState.CLOSED


def test_outcomes_that_say_nothing_never_open_it() -> None:
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=10)
    for t in range(100):
        breaker.finish(breaker.start(t), NONE, t)
    assert breaker.allows(100)


@dataclass
class Attempt:
    ticket: int
    started: float


# Events: start an attempt, end the oldest / newest in flight with an outcome,
# let time pass.
events = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.just(NONE)),
        st.tuples(st.sampled_from(["end-oldest", "end-newest"]), st.sampled_from(list(Outcome))),
        st.tuples(st.just("wait"), st.sampled_from([0.1, 1.0, 5.0, 20.0])),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(history=events, leftover=st.booleans())
def test_a_replica_whose_engine_answers_is_never_left_unroutable(
    history: list[tuple[str, object]], leftover: bool
) -> None:
    open_seconds, probe_seconds = 10.0, 30.0
    breaker = CircuitBreaker(
        failure_threshold=3, open_seconds=open_seconds, probe_seconds=probe_seconds
    )
    now = 0.0
    inflight: list[Attempt] = []
    for kind, value in history:
        if kind == "start":
            if breaker.allows(now):
                inflight.append(Attempt(breaker.start(now), now))
        elif kind == "wait":
            assert isinstance(value, float)
            now += value
        elif inflight:
            assert isinstance(value, Outcome)
            attempt = inflight.pop(0 if kind == "end-oldest" else -1)
            breaker.finish(attempt.ticket, value, now)
    if not leftover:
        # Every attempt ends somehow (the proxy's finally), without a verdict.
        for attempt in inflight:
            breaker.finish(attempt.ticket, NONE, now)
    # From here the engine answers every request that reaches it, and
    # attempts still in flight never end: the replica must come back.
    deadline = now + open_seconds + probe_seconds
    while now <= deadline and breaker.state(now) is not CircuitState.CLOSED:
        if breaker.allows(now):
            breaker.finish(breaker.start(now), OK, now)
        now += 0.5
    assert breaker.state(now) is CircuitState.CLOSED and breaker.allows(now)


def test_the_probe_that_closed_it_failing_later_reopens_it_and_no_other_attempt_does() -> None:
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=10)
    breaker.finish(breaker.start(0), FAILED, 0)
    probe = breaker.start(10)
    assert breaker.finish(probe, OK, 10)  # its first bytes: closed
    after = breaker.start(11)  # a request of the closed epoch, still streaming
    assert breaker.finish(probe, FAILED, 12)  # the probe's stream stalls
    assert breaker.state(12) is CircuitState.OPEN
    # The attempt that began while it was closed says nothing any more.
    assert not breaker.finish(after, FAILED, 13)
    assert breaker.state(22) is CircuitState.HALF_OPEN


def test_a_recheck_lets_the_next_request_probe_an_open_breaker_at_once() -> None:
    breaker = opened()
    breaker.recheck(1.0)
    assert breaker.state(1.0) is CircuitState.HALF_OPEN and breaker.allows(1.0)
    breaker.finish(breaker.start(1.0), OK, 1.5)
    assert breaker.state(1.5) is CircuitState.CLOSED


def test_after_a_recheck_attempts_from_before_it_and_past_failures_do_not_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2, open_seconds=10, probe_seconds=60)
    earlier = breaker.start(0.0)
    breaker.finish(breaker.start(0.0), FAILED, 0.0)  # one of two
    breaker.recheck(1.0)
    breaker.finish(earlier, FAILED, 1.0)  # sent before: no verdict
    breaker.finish(breaker.start(1.0), FAILED, 1.0)  # one of two again
    assert breaker.state(1.0) is CircuitState.CLOSED
