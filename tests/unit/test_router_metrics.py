"""The router's per-replica gauges are read when Prometheus collects."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from shoal.router.breaker import CircuitBreaker, Outcome
from shoal.router.fleet import Endpoint, Replica
from shoal.router.metrics import RouterMetrics

OPEN_SECONDS = 0.05


def _replica(uid: str, name: str = "engine-0") -> Replica:
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=OPEN_SECONDS, probe_seconds=1.0)
    return Replica(
        endpoint=Endpoint(id=uid, name=name, url="http://e", routable=True), breaker=breaker
    )


def _sample(metrics: RouterMetrics, line: str) -> float:
    for row in generate_latest(metrics.registry).decode().splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    raise AssertionError(f"{line} not exported")


def test_in_flight_and_breaker_state_are_what_they_are_when_scraped() -> None:
    metrics = RouterMetrics()
    replica = _replica("uid-1")
    metrics.series(replica)
    inflight = 'shoal_router_inflight_requests{replica="engine-0"}'
    circuit = 'shoal_router_circuit_state{replica="engine-0"}'
    replica.inflight = 3
    assert _sample(metrics, inflight) == 3.0
    ticket = replica.breaker.start(time.monotonic())
    replica.breaker.finish(ticket, Outcome.FAILED, time.monotonic())
    assert _sample(metrics, circuit) == 2.0  # open
    # No request came since; the breaker turned half-open all the same.
    time.sleep(2 * OPEN_SECONDS)
    assert _sample(metrics, circuit) == 1.0


def test_a_restarted_pod_of_the_same_name_is_the_one_reported() -> None:
    metrics = RouterMetrics()
    old, new = _replica("uid-1"), _replica("uid-2")
    old.inflight, new.inflight = 7, 1
    metrics.series(old)
    metrics.series(new)
    assert _sample(metrics, 'shoal_router_inflight_requests{replica="engine-0"}') == 1.0


def test_a_replica_that_leaves_loses_its_gauges_and_keeps_its_counts() -> None:
    metrics = RouterMetrics()
    replica = _replica("uid-1")
    metrics.series(replica).requests(200).inc()
    metrics.series(replica).ttft.observe(0.02)
    metrics.forget("engine-0")
    text = generate_latest(metrics.registry).decode()
    assert 'shoal_router_inflight_requests{replica="engine-0"}' not in text
    assert 'shoal_router_circuit_state{replica="engine-0"}' not in text
    # Sums over replicas never go down: the autoscaler would read a drop as a restart.
    assert _sample(metrics, 'shoal_router_requests_total{code="200",replica="engine-0"}') == 1.0
    assert _sample(metrics, 'shoal_router_upstream_ttft_seconds_count{replica="engine-0"}') == 1.0
    # Back under the same name, it counts on from there.
    metrics.series(_replica("uid-2")).requests(200).inc()
    assert _sample(metrics, 'shoal_router_requests_total{code="200",replica="engine-0"}') == 2.0
