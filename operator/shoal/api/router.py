"""The router's settings, defined once.

`RouterSettings` is both the VLLMCluster's `spec.router` (which adds how the
router is deployed: `RouterSpec` in `spec`) and the router's own `router.json`
(which adds what the operator derives from the rest of the spec: the router's
`RouterConfig`). So a router started by `shoal demo`, `shoal bench` or a test
runs on exactly the settings and defaults an operator-deployed one has, and
every policy knob can be set from the resource and read in `kubectl explain`.

Durations are integer `...Seconds`, or `...Milliseconds` where sub-second
values matter, as in the Kubernetes API conventions. Pure."""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import Field

from shoal.schema.model import ApiModel
from shoal.schema.quantity import Quantity, parse_quantity

# The router's internal port: its hot prefixes (warm-up reads them from the
# router pods) and its placements (its peers read them). Never in the Service.
INTERNAL_PORT = 9090
# A stopping router's drain is drainSeconds at most; answers still under way
# after it get this long before their connections are cut.
CLOSE_SECONDS = 5
# Scrapes may take most of an interval; metrics older than a few intervals
# (and never under 2 s) count as full load.
_SCRAPE_TIMEOUT_SHARE = 0.8
_STALE_INTERVALS = 8
_MIN_STALE_MILLISECONDS = 2000


class RouterPolicy(StrEnum):
    """How a request picks a replica."""

    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    LEAST_REQUEST = "least-request"
    POWER_OF_TWO = "power-of-two"
    LOAD_AWARE = "load-aware"
    SESSION = "session"
    PREFIX = "prefix"
    CACHE_AWARE = "cache-aware"


class LoadWeights(ApiModel):
    """Weights of the load score L = kvUsage x KV usage + queue x min(waiting / qNorm, 1)
    + running x running / maxNumSeqs."""

    kv_usage: float = Field(default=0.5, ge=0, le=1, description="Weight of KV cache usage.")
    queue: float = Field(default=0.3, ge=0, le=1, description="Weight of the waiting queue.")
    running: float = Field(default=0.2, ge=0, le=1, description="Weight of running requests.")


class RouterThresholds(ApiModel):
    """Knobs of the policies. cache-aware picks the replica with the least prefill ahead
    of the request's first token (queued there, plus the prompt's uncached part, plus
    beta x loadTokens for its load score), within bounded load."""

    beta: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="How much a replica's scraped load counts against prefill saved by a "
        "cache hit (1: a fully loaded replica costs as much as loadTokens prompt tokens).",
    )
    load_tokens: float = Field(
        default=2048,
        ge=0,
        le=10_000_000,
        description="cache-aware: prompt tokens of prefill that a fully loaded replica "
        "(load score 1) is worth, times beta, when weighing load against cache hits.",
    )
    # 2, not 1: measured beside smg (docs/benchmarks.md, session 13), a cached
    # token counted twice kept 1.5-2.3 points more hits at 15-60/s, and a lower
    # mean TTFT, since a prompt placed elsewhere also evicts another from there.
    hit_weight: float = Field(
        default=2.0,
        ge=0,
        le=10,
        description="cache-aware: prefill tokens a cached prompt token is worth in the cost "
        "(1: exactly the prefill it saves; above 1 a prompt stays where its prefix is cached "
        "against more queued work, since placing it elsewhere also evicts another prompt "
        "from that replica's KV cache).",
    )
    chars_per_token: float = Field(
        default=4.0,
        gt=0,
        le=100,
        description="Characters of prompt text per token, to estimate prefill work "
        "without tokenizing.",
    )
    epsilon: float = Field(
        default=0.25,
        ge=0,
        le=10,
        description="Bounded load: never pick a replica that would then run more than "
        "(1 + epsilon) times the mean of requests (running and waiting), so one hot prefix "
        "cannot pin all traffic to one replica.",
    )
    # 16, not 4: measured beside smg (docs/benchmarks.md), a floor of 4 spilled
    # a hot tenant at a fair share of light load, and under KV pressure each
    # spill evicted another tenant's prompt; the cost already prices a busy holder.
    bounded_load_min_requests: int = Field(
        default=16,
        ge=1,
        le=100000,
        description="Bounded load allows at least this many requests on a replica, so "
        "affinity holds while the fleet is lightly loaded (below it, the prefill queued "
        "and the scraped load alone keep a busy holder from taking more).",
    )
    tie_tolerance: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="Scores this close to the best count as tied and go by rendezvous "
        "hashing of the prompt's first block, so router replicas whose load views differ "
        "slightly still agree (cache-aware: this share of the prompt's tokens plus "
        "loadTokens).",
    )
    q_norm: int = Field(
        default=20,
        ge=1,
        le=100000,
        description="Waiting requests that count as a full queue; a replica with this many "
        "waiting is saturated.",
    )
    saturated_kv_usage: float = Field(
        default=0.95, gt=0, le=1, description="KV cache usage at which a replica is saturated."
    )
    affinity_threshold: float = Field(
        default=0.7,
        ge=0,
        le=1,
        description="Policy session: a session (header x-session-id, or the body's user) "
        "keeps its replica while that replica's load is below this; above, it falls back. "
        "(cache-aware keeps conversations on their replica through the prefix index.)",
    )
    prefix_block_chars: int = Field(
        default=64,
        ge=1,
        le=65536,
        description="Characters per block when hashing prompt prefixes (about 16 tokens).",
    )
    max_prefix_blocks: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="Prefix blocks hashed per request; text beyond them is not matched.",
    )
    index_blocks_per_replica: int = Field(
        default=16_384,
        ge=1,
        le=16_777_216,
        description="Prefix blocks the router remembers per replica (least recently used "
        "first out); about twice what an 8B engine's KV pool holds, so the index forgets "
        "roughly when the engine does.",
    )


class RouterTimeouts(ApiModel):
    """Deadlines of a client's request headers and body, then of one upstream attempt
    (keep those shorter than the engine's)."""

    # Headers come in one packet from any real client; only a client that
    # trickles them in (slowloris) needs more than a few seconds.
    client_header_seconds: int = Field(
        default=10,
        ge=1,
        le=3600,
        description="For a client to send a request's headers, from its connection (or its "
        "previous request's first byte after an idle keep-alive); a client still sending "
        "them then gets 408 and the connection is closed.",
    )
    client_body_seconds: int = Field(
        default=60,
        ge=1,
        le=3600,
        description="For a client to send its whole request body; a body still "
        "incomplete then gets 408 and the connection is closed.",
    )

    connect_seconds: int = Field(default=5, ge=1, le=3600, description="To connect to a replica.")
    first_byte_seconds: int = Field(
        default=120,
        ge=1,
        le=86400,
        description="From sending a request to its response headers (a hung engine never "
        "sends them). vLLM sends a plain (not streamed) answer's headers with the whole "
        "answer, so its wait goes on, firstByteSeconds at a time, while the replica's "
        "engine generates tokens (up to totalSeconds).",
    )
    total_seconds: int = Field(
        default=600, ge=1, le=86400, description="For the whole response, streaming included."
    )
    # A loaded engine's decode step takes tens to hundreds of milliseconds;
    # a gap of 30 s between chunks is an engine that stopped, not a slow one.
    stall_seconds: int = Field(
        default=30,
        ge=1,
        le=86400,
        description="Longest gap between two chunks of a streamed answer (the first chunk "
        "has firstByteSeconds); past it the stream ends with an error event, the engine's "
        "request is aborted and the replica counts a failure.",
    )


class CircuitBreaker(ApiModel):
    """Stops sending to a replica that keeps failing, then tries it again."""

    failure_threshold: int = Field(
        default=5, ge=1, le=1000, description="Consecutive failures that open the circuit."
    )
    open_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="How long an open circuit stays open before one probe request is let through.",
    )


class RouterQueue(ApiModel):
    """Admission queue used when every replica is saturated."""

    max_queued: int = Field(
        default=256,
        ge=0,
        le=1000000,
        description="Requests waiting in the router; beyond it the router answers 429 "
        "with Retry-After. Requests held at zero replicas wait here too, so "
        "autoscaling.minReplicas 0 needs it above 0.",
    )
    max_wait_seconds: int = Field(
        default=30, ge=1, le=3600, description="Longest a request waits for a replica."
    )
    retry_after_seconds: int = Field(
        default=1, ge=1, le=3600, description="The Retry-After header sent with a 429 or 503."
    )
    zero_replica_wait_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="With no replica at all (scaled to zero), how long a request is held "
        "(in arrival order, up to maxQueued of them) for one to start and warm; past it "
        "the answer is 503 with Retry-After. The routers stay Ready meanwhile, and count "
        "held requests in shoal_router_queue_depth, which the autoscaler reads. 0: answer "
        "503 at once.",
    )


class HotPrefixes(ApiModel):
    """The most shared prompt prefixes, kept for warming new replicas. They are
    prompt text: off by default, and never exposed outside the cluster."""

    enabled: bool = Field(default=False, description="Keep hot prefixes.")
    max_prefixes: int = Field(default=32, ge=1, le=1024, description="Prefixes kept (top K).")
    max_chars: int = Field(
        default=4096, ge=64, le=65536, description="Characters kept of each prefix."
    )


class RouterTracing(ApiModel):
    """OpenTelemetry traces of each request (W3C trace context): queueing, the routing
    decision and each upstream attempt. Off by default; needs the `tracing` extra
    (`pip install shoal[tracing]`). Without it, a client's traceparent still reaches
    the engines unchanged."""

    otlp_endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description="OTLP/HTTP traces endpoint the router exports its spans to, e.g. "
        "http://otel-collector.monitoring:4318/v1/traces. Unset: no spans are recorded.",
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Share of new traces recorded; a request that comes with a traceparent "
        "follows its caller's sampling decision.",
    )


class RouterSettings(ApiModel):
    """How the router routes and copes with slow or failing replicas."""

    policy: RouterPolicy = Field(
        default=RouterPolicy.CACHE_AWARE,
        description="How a request picks a replica: round-robin, random, least-request, "
        "power-of-two, load-aware (lowest load score), session (sticky by session key), "
        "prefix (by prompt prefix), or cache-aware (least prefill ahead of the first token: "
        "what is queued there plus the prompt's uncached part, with load, within bounded "
        "load).",
    )
    weights: LoadWeights = Field(default_factory=LoadWeights)
    thresholds: RouterThresholds = Field(default_factory=RouterThresholds)
    scrape_interval_milliseconds: int = Field(
        default=250,
        ge=10,
        le=60000,
        description="How often the router reads every replica's /metrics in the background.",
    )
    scrape_timeout_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=60000,
        description="Deadline of one scrape. Default: 80% of scrapeIntervalMilliseconds.",
    )
    stale_after_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=3_600_000,
        description="A replica whose metrics are older than this counts as fully loaded. "
        "Default: 8 scrape intervals, and at least 2 s.",
    )
    timeouts: RouterTimeouts = Field(default_factory=RouterTimeouts)
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries on another replica, only before any byte of the response was "
        "sent: on connection errors, timeouts and server errors (5xx). A server error that "
        "recurs on a second replica is the request's: it goes back to the client and counts "
        "against neither replica.",
    )
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    queue: RouterQueue = Field(default_factory=RouterQueue)
    max_request_size: Quantity = Field(
        default="4Mi", description="Largest request body accepted; larger ones get 413."
    )
    max_client_connections: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="Open client connections one router pod holds on each of its ports (the "
        "API's and the internal one); a connection beyond it is answered 503 with Retry-After "
        "and closed, so stalled clients cannot use up the pod's file descriptors.",
    )
    replica_header: bool = Field(
        default=False,
        description="For debugging: answers name the replica that served them "
        "(x-shoal-replica: its pod name, or host:port). Off, nothing internal is shown.",
    )
    tracing: RouterTracing = Field(default_factory=RouterTracing)
    hot_prefixes: HotPrefixes = Field(default_factory=HotPrefixes)
    share_placements: bool = Field(
        default=True,
        description="With several router replicas: each tells the others, on its internal "
        "port, which replica it sent each prompt to, so a conversation whose turns reach "
        "different routers keeps the replica that caches its history (best effort: a peer "
        "that is down costs hits, never requests). Off: each router learns only from its "
        "own requests.",
    )
    api_key_reload_seconds: int = Field(
        default=10,
        ge=1,
        le=3600,
        description="How often a router re-reads its API key file, to take up a rotated "
        "Secret without a restart.",
    )
    drain_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="On shutdown, longest wait for requests in flight to finish.",
    )

    @property
    def scrape_interval_seconds(self) -> float:
        return self.scrape_interval_milliseconds / 1000

    @property
    def scrape_timeout_seconds(self) -> float:
        if self.scrape_timeout_milliseconds is not None:
            return self.scrape_timeout_milliseconds / 1000
        return round(self.scrape_interval_milliseconds * _SCRAPE_TIMEOUT_SHARE) / 1000

    @property
    def stale_after_seconds(self) -> float:
        if self.stale_after_milliseconds is not None:
            return self.stale_after_milliseconds / 1000
        stale = self.scrape_interval_milliseconds * _STALE_INTERVALS
        return max(_MIN_STALE_MILLISECONDS, stale) / 1000

    @property
    def max_body_bytes(self) -> int:
        return math.floor(parse_quantity(self.max_request_size))
