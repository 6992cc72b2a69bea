"""The fleet's view of a replica that failed: recovery at light load, where
nothing spills requests onto it."""

from __future__ import annotations

from collections import Counter

import pytest

import shoal.router.fleet as fleet_module
from shoal.engine.metrics import MetricsSnapshot
from shoal.router.breaker import CircuitState, Outcome
from shoal.router.config import RouterConfig
from shoal.router.fleet import Endpoint, Fleet
from shoal.router.policy import Chooser
from shoal.router.prefix import prefix_key, request_facts


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(fleet_module, "time", fake)
    return fake


def _idle_fleet(config: RouterConfig, clock: _Clock) -> Fleet:
    fleet = Fleet(config)
    fleet.update(
        [Endpoint(id=f"r{i}", name=f"r{i}", url=f"http://r{i}", routable=True) for i in range(3)]
    )
    for replica in fleet.replicas.values():
        fleet.record_scrape(replica.id, MetricsSnapshot(), clock.now)
    fleet.sweep(clock.now)
    return fleet


def _picks(fleet: Fleet, config: RouterConfig, n: int) -> Counter[str]:
    """Where n different cold prompts, one at a time, would go."""
    chooser = Chooser(config)
    picks: Counter[str] = Counter()
    for i in range(n):
        prompt = f"question {i}: what is {i} squared?"
        key = prefix_key(
            prompt,
            block_chars=config.thresholds.prefix_block_chars,
            max_blocks=config.thresholds.max_prefix_blocks,
        )
        choice, _ = fleet.decide(chooser, key, request_facts(prompt, key, config))
        assert choice is not None
        picks[choice.replica] += 1
    return picks


def _fail(fleet: Fleet, replica_id: str, times: int) -> None:
    replica = fleet.replicas[replica_id]
    for _ in range(times):
        ticket = fleet.begin(replica)
        fleet.verdict(replica, ticket, Outcome.FAILED)
        fleet.end(replica, ticket)


def test_a_half_open_replica_gets_its_probe_at_light_load_and_is_trusted_once_it_answers(
    clock: _Clock,
) -> None:
    """Its recent error rate must not keep the probe away: at light load
    nothing else (bounded load's spill) would send it a request, and its
    breaker would stay half-open until the rate had faded (tens of seconds)."""
    config = RouterConfig.model_validate(
        {"circuitBreaker": {"failureThreshold": 3, "openSeconds": 2}}
    )
    fleet = _idle_fleet(config, clock)
    r0 = fleet.replicas["r0"]
    _fail(fleet, "r0", 3)
    assert r0.breaker.state(clock.now) is CircuitState.OPEN
    assert "r0" not in _picks(fleet, config, 30)

    clock.now += 2.5
    for replica in fleet.replicas.values():
        fleet.record_scrape(replica.id, MetricsSnapshot(), clock.now)
    fleet.sweep(clock.now)
    assert r0.breaker.state(clock.now) is CircuitState.HALF_OPEN
    assert r0.errors > 0.3  # faded only a little
    assert _picks(fleet, config, 30)["r0"] >= 1, "the probe never reaches it"

    ticket = fleet.begin(r0)
    fleet.verdict(r0, ticket, Outcome.OK)
    fleet.end(r0, ticket)
    assert r0.breaker.state(clock.now) is CircuitState.CLOSED
    # The probe answered: it is as trusted as its peers, and draws its share.
    assert r0.errors == 0.0
    assert _picks(fleet, config, 60)["r0"] >= 10


def test_a_replica_failing_below_the_threshold_stays_scored_down(clock: _Clock) -> None:
    """The error rate still counts while the breaker is closed: a replica that
    failed twice but not enough to open draws less than its share."""
    config = RouterConfig.model_validate({"circuitBreaker": {"failureThreshold": 5}})
    fleet = _idle_fleet(config, clock)
    _fail(fleet, "r0", 3)
    assert fleet.replicas["r0"].breaker.state(clock.now) is CircuitState.CLOSED
    assert _picks(fleet, config, 60)["r0"] == 0


def test_a_probe_whose_stream_breaks_after_its_first_bytes_reopens_the_breaker(
    clock: _Clock,
) -> None:
    """A probe's verdict comes with its first bytes (so a long stream does not
    hold the breaker half-open), but an engine that stalls mid-stream has not
    recovered: the probe's own failure reopens the breaker, and the replica's
    error rate stays."""
    config = RouterConfig.model_validate(
        {"circuitBreaker": {"failureThreshold": 2, "openSeconds": 1}}
    )
    fleet = _idle_fleet(config, clock)
    r0 = fleet.replicas["r0"]
    _fail(fleet, "r0", 2)
    clock.now += 1.5
    fleet.sweep(clock.now)
    probe = fleet.begin(r0)
    fleet.verdict(r0, probe, Outcome.OK)  # its first bytes
    assert r0.breaker.state(clock.now) is CircuitState.CLOSED
    before = r0.errors
    assert before > 0.1  # still scored down while the probe streams
    fleet.verdict(r0, probe, Outcome.FAILED)  # then it stalls
    fleet.end(r0, probe)
    assert r0.breaker.state(clock.now) is CircuitState.OPEN
    assert r0.errors > before
    assert "r0" not in _picks(fleet, config, 30)


def test_a_verdict_that_opens_the_breaker_counts_before_its_request_ends(
    clock: _Clock,
) -> None:
    """A failed attempt's verdict comes before its end (a 5xx's body still
    read, a stream's last bytes still sent): decisions meanwhile must not see
    the replica as it was before."""
    config = RouterConfig.model_validate({"circuitBreaker": {"failureThreshold": 1}})
    fleet = _idle_fleet(config, clock)
    assert _picks(fleet, config, 30)["r0"] > 0
    r0 = fleet.replicas["r0"]
    ticket = fleet.begin(r0)
    _picks(fleet, config, 1)  # a decision while it runs
    fleet.verdict(r0, ticket, Outcome.FAILED)
    assert r0.breaker.state(clock.now) is CircuitState.OPEN
    assert "r0" not in _picks(fleet, config, 30)
    fleet.end(r0, ticket)


def test_prefill_the_peer_routers_queued_counts_until_they_say_it_is_done(
    clock: _Clock,
) -> None:
    """What another router sent a replica and has not seen prefilled is ahead
    of this router's request there too; it is what the peer last said, and
    nothing once the peer says nothing or is gone."""
    config = RouterConfig()
    fleet = _idle_fleet(config, clock)

    def pending() -> dict[str, float]:
        return {c.replica: c.pending for c in fleet.candidates(key=None)}

    own = fleet.begin(fleet.replicas["r0"], prefill_tokens=100)
    fleet.foreign_pending("http://peer-a", {"r0": 500, "r1": 3000, "gone": 7})
    fleet.foreign_pending("http://peer-b", {"r1": 1000})
    assert pending() == {"r0": 600, "r1": 4000, "r2": 0}
    # Cold prompts avoid the replica the peers loaded, though this router sent it nothing.
    assert _picks(fleet, config, 30)["r1"] == 0
    fleet.foreign_pending("http://peer-a", {"r0": 200})
    assert pending() == {"r0": 300, "r1": 1000, "r2": 0}
    fleet.foreign_pending("http://peer-b", {})
    fleet.foreign_pending("http://peer-a", {})
    assert pending() == {"r0": 100, "r1": 0, "r2": 0}
    fleet.end(fleet.replicas["r0"], own)


def test_views_are_recomputed_once_per_decision_however_many_requests_changed_them(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RouterConfig()
    fleet = _idle_fleet(config, clock)
    computed: Counter[str] = Counter()
    view = Fleet._view

    def counting(self: Fleet, replica: fleet_module.Replica, now: float) -> None:
        computed[replica.id] += 1
        view(self, replica, now)

    monkeypatch.setattr(Fleet, "_view", counting)
    r0 = fleet.replicas["r0"]
    tickets = [fleet.begin(r0, prefill_tokens=100.0) for _ in range(5)]
    fleet.prefilled(r0, 100.0)
    fleet.end(r0, tickets[0])
    assert computed == Counter()  # nothing read the views yet
    candidates = {c.replica: c for c in fleet.candidates(key=None)}
    assert computed == Counter({"r0": 1})
    # The one recomputation saw every change: 4 in flight, 4 x 100 tokens queued.
    assert candidates["r0"].inflight == 4
    assert candidates["r0"].pending == 400.0
    fleet.candidates(key=None)
    assert computed == Counter({"r0": 1})  # nothing changed since
