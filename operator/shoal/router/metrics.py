"""The router's own Prometheus metrics (`shoal_router_*`). The replica label
is the pod name (or host:port for static endpoints), so cardinality is bounded
by the fleet's names (a StatefulSet's pod names are reused). A replica that
leaves loses its gauges (state, load, in flight, scrape failures); its request
counts and TTFT histogram stay, so sums over replicas never go down: the
operator's error window and the autoscaler's "a request arrived" read a drop as
a restarted router."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from shoal.router.tallies import CounterFamily, HistogramFamily, Spread, Tally

if TYPE_CHECKING:
    from shoal.router.connections import HttpServer
    from shoal.router.fleet import Replica

# Names other parts read (the operator's health loop, the demo's live view).
REQUESTS = "shoal_router_requests"
LOAD_SCORE = "shoal_router_load_score"
# The autoscaler's demand (docs/autoscaling.md: stable names for KEDA and HPA users).
INFLIGHT = "shoal_router_inflight_requests"
QUEUE_DEPTH = "shoal_router_queue_depth"


class Listener(StrEnum):
    """The router's ports, as its connection series label them."""

    API = "api"  # clients (the Service's port)
    INTERNAL = "internal"  # probes, the operator, the other routers


def read_samples(text: str) -> Iterator[Sample]:
    """The samples of (part of) a router's /metrics text, for the operator's readers.
    ValueError when it is not Prometheus text, or a value is NaN, infinite or
    negative, which none of the router's counts and gauges can be (and no
    replica count can follow: a negative count of requests could even read as
    a failing replica's)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not math.isfinite(sample.value) or sample.value < 0:
                raise ValueError(f"{sample.name} is {sample.value}")
            yield sample


_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_DECISION = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The request path's series: tallies (no lock per update, see tallies.py).
        self.requests = CounterFamily(
            REQUESTS,
            "Attempts answered, by replica and HTTP code: a replica's failures that were "
            "retried elsewhere count too (502 connect error, 504 no answer in time), so the "
            "operator sees its error rate; replica none: answered by the router itself.",
            ["replica", "code"],
            registry=r,
        )
        self.decision = HistogramFamily(
            "shoal_router_decision_seconds",
            "Time from the parsed request to the chosen replica (no I/O).",
            [],
            registry=r,
            buckets=_DECISION,
        ).labels()
        self.ttft = HistogramFamily(
            "shoal_router_upstream_ttft_seconds",
            "Time from sending a streamed request upstream to its first token (the first "
            "bytes of the answer's body; its headers come before the prefill). Not observed "
            "for answers that are not streamed, which come whole.",
            ["replica"],
            registry=r,
            buckets=_LATENCY,
        )
        self.latency = HistogramFamily(
            "shoal_router_request_seconds",
            "End-to-end request latency at the router.",
            [],
            registry=r,
            buckets=_LATENCY,
        ).labels()
        self.retries = Counter(
            "shoal_router_retries",
            "Requests retried on another replica, by reason.",
            ["reason"],
            registry=r,
        )
        self.circuit = Gauge(
            "shoal_router_circuit_state",
            "Circuit breaker: 0 closed, 1 half-open, 2 open.",
            ["replica"],
            registry=r,
        )
        self.load = Gauge(
            LOAD_SCORE,
            "Load score L of each replica as the router sees it.",
            ["replica"],
            registry=r,
        )
        self.predicted_hit = HistogramFamily(
            "shoal_router_predicted_hit_ratio",
            "Expected prefix-cache hit share of the chosen replica.",
            [],
            registry=r,
            buckets=(0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
        ).labels()
        self.queue_depth = Gauge(
            QUEUE_DEPTH,
            "Requests waiting for a replica: every replica saturated, or none at all "
            "(held while the fleet scales from zero).",
            registry=r,
        )
        self.zero_wait = Histogram(
            "shoal_router_zero_replica_wait_seconds",
            "How long requests held while no replica was routable (scaled to zero) waited, "
            "released or refused.",
            buckets=_LATENCY,
            registry=r,
        )
        self.rejected = Counter(
            "shoal_router_rejected",
            "Requests refused before reaching a replica, by reason.",
            ["reason"],
            registry=r,
        )
        self.routable = Gauge(
            "shoal_router_routable_endpoints", "Replicas that may take traffic.", registry=r
        )
        self.scrape_failures = Counter(
            "shoal_router_scrape_failures",
            "Scrapes of a replica's /metrics that failed, timed out or could not be parsed; "
            "meanwhile its load counts as unknown (busy, still routable).",
            ["replica"],
            registry=r,
        )
        self.peers = Gauge(
            "shoal_router_peers",
            "Other router replicas whose placements this one follows (sharePlacements).",
            registry=r,
        )
        self.peer_placements = Counter(
            "shoal_router_peer_placements",
            "Placements read from the other router replicas and recorded in this one's "
            "prefix index.",
            registry=r,
        )
        self.inflight = Gauge(
            INFLIGHT,
            "Requests in flight, by replica.",
            ["replica"],
            registry=r,
        )
        self.connections = Gauge(
            "shoal_router_client_connections",
            "Open connections to the router, by port (api, internal); each port holds at "
            "most spec.router.maxClientConnections.",
            ["port"],
            registry=r,
        )
        self.connections_refused = Counter(
            "shoal_router_connections_refused",
            "Connections answered 503 and closed because the port held "
            "spec.router.maxClientConnections already, by port.",
            ["port"],
            registry=r,
        )

        self._series: dict[str, ReplicaSeries] = {}

    def series(self, replica: Replica) -> ReplicaSeries:
        """The replica's labelled children, looked up once: `labels()` costs
        a tuple and a dict lookup per call, and the request path would
        otherwise pay it five times a request. Its in-flight count and breaker
        state are read when Prometheus collects, not set on every request; from
        the latest replica of that name (a restarted pod keeps its name)."""
        name = replica.endpoint.name
        found = self._series.get(name)
        if found is None:
            found = self._series[name] = self._watch(replica)
        found.source = replica
        return found

    def _watch(self, replica: Replica) -> ReplicaSeries:
        name = replica.endpoint.name
        series = ReplicaSeries(ttft=self.ttft.labels(name), parent=self.requests, source=replica)
        self.inflight.labels(name).set_function(lambda: series.source.inflight)
        self.circuit.labels(name).set_function(
            lambda: int(series.source.breaker.state(time.monotonic()))
        )
        return series

    def watch_connections(self, port: Listener, server: HttpServer) -> None:
        """The port's open connections, read when Prometheus collects, and its
        refusals, counted as they happen."""
        self.connections.labels(port).set_function(lambda: len(server.connections))
        server.on_refused = self.connections_refused.labels(port).inc

    def forget(self, replica: str) -> None:
        self._series.pop(replica, None)
        for gauge in (self.circuit, self.load, self.inflight, self.scrape_failures):
            with contextlib.suppress(KeyError):
                gauge.remove(replica)


@dataclass(slots=True)
class ReplicaSeries:
    ttft: Spread
    parent: CounterFamily
    source: Replica  # the latest replica of this name
    _requests: dict[int, Tally] = field(default_factory=dict)

    def requests(self, code: int) -> Tally:
        """`shoal_router_requests{replica, code}`, cached per code."""
        child = self._requests.get(code)
        if child is None:
            child = self._requests[code] = self.parent.labels(self.source.endpoint.name, str(code))
        return child
