"""The router's configuration: `router.json`, which the operator writes from
the VLLMCluster's `spec.router` (camelCase keys, as in the resource)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Policy(StrEnum):
    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    LEAST_REQUEST = "least-request"
    POWER_OF_TWO = "power-of-two"
    LOAD_AWARE = "load-aware"
    SESSION = "session"
    PREFIX = "prefix"
    CACHE_AWARE = "cache-aware"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class LoadWeights(_Model):
    kv: float = Field(0.5, ge=0, description="Weight of KV-cache usage in the load score.")
    queue: float = Field(0.3, ge=0, description="Weight of waiting requests (over qNorm).")
    running: float = Field(0.2, ge=0, description="Weight of running requests (over maxNumSeqs).")


class Timeouts(_Model):
    # Shorter than the engine's own, so the router gives up (and retries) first.
    connect_seconds: float = Field(2.0, gt=0, description="Deadline to connect to a replica.")
    first_byte_seconds: float = Field(
        120.0,
        gt=0,
        description="Deadline for a replica's response headers (a hung engine never sends them).",
    )
    total_seconds: float = Field(600.0, gt=0, description="Deadline for a whole request.")


class Breaker(_Model):
    failure_threshold: int = Field(5, ge=1, description="Consecutive failures that open it.")
    open_seconds: float = Field(
        10.0, gt=0, description="Time open before one probe is let through."
    )


class Queue(_Model):
    max_size: int = Field(256, ge=0, description="Requests held while every replica is saturated.")
    timeout_seconds: float = Field(30.0, gt=0, description="Longest wait in the queue.")
    retry_after_seconds: int = Field(1, ge=1, description="Retry-After sent with a 429.")


class HotPrefixes(_Model):
    enabled: bool = Field(False, description="Track the most shared prompt prefixes (for warm-up).")
    top_k: int = Field(64, ge=1, description="How many prefixes to keep.")
    max_chars: int = Field(4096, ge=64, description="Longest prefix kept, in characters.")
    port: int = Field(9090, ge=0, description="Internal port serving them (0: a free one).")


class RouterConfig(_Model):
    policy: Policy = Field(Policy.CACHE_AWARE, description="How a replica is chosen.")
    weights: LoadWeights = Field(default_factory=LoadWeights)
    beta: float = Field(1.0, ge=0, description="Weight of load against expected cache hit.")
    load_tokens: float = Field(
        2048,
        ge=0,
        description="cache-aware: prompt tokens of prefill that a fully loaded replica "
        "(load score 1) is worth, times beta, when weighing load against cache hits.",
    )
    chars_per_token: float = Field(
        4.0, gt=0, description="Characters of prompt text per token, to estimate prefill work."
    )
    epsilon: float = Field(
        0.25, ge=0, description="Bounded load: no replica above (1 + epsilon) x mean load."
    )
    bounded_load_min_requests: int = Field(
        4,
        ge=1,
        description="Bounded load allows at least this many requests' worth of load on a "
        "replica, so affinity holds while the fleet is nearly idle.",
    )
    q_norm: int = Field(20, ge=1, description="Waiting requests that count as a full queue.")
    saturation_kv: float = Field(0.95, gt=0, le=1, description="KV usage that saturates a replica.")
    tie_tolerance: float = Field(
        0.05,
        ge=0,
        description="Scores this close to the best count as tied and go by rendezvous hashing, "
        "so router replicas whose load views differ slightly still agree (cache-aware: "
        "this share of the prompt's tokens plus loadTokens).",
    )
    affinity_threshold: float = Field(
        0.7,
        ge=0,
        le=1,
        description="A session keeps its replica while that replica's load is below this.",
    )
    block_chars: int = Field(
        64, ge=1, description="Characters per prefix block (about 16 tokens of text)."
    )
    max_prefix_blocks: int = Field(256, ge=1, description="Prefix blocks hashed per request.")
    index_blocks_per_replica: int = Field(
        16_384,
        ge=1,
        description="Prefix blocks remembered per replica (LRU); about twice what an 8B "
        "engine's KV pool holds, so the index forgets roughly when the engine does.",
    )
    max_num_seqs: int = Field(256, ge=1, description="The engines' --max-num-seqs, per replica.")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    max_retries: int = Field(2, ge=0, description="Other replicas tried before any byte is sent.")
    breaker: Breaker = Field(default_factory=Breaker)
    queue: Queue = Field(default_factory=Queue)
    scrape_interval_seconds: float = Field(0.25, gt=0, description="Metrics scrape period.")
    scrape_timeout_seconds: float = Field(0.2, gt=0, description="Deadline of one scrape.")
    stale_after_seconds: float = Field(
        2.0, gt=0, description="Metrics older than this count as full load."
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest request body.")
    api_key_file: str | None = Field(None, description="File of accepted API keys, one per line.")
    api_key_reload_seconds: float = Field(
        10.0, gt=0, description="How often the API key file is checked for new keys."
    )
    drain_seconds: float = Field(30.0, ge=0, description="Longest wait for requests on shutdown.")
    hot_prefixes: HotPrefixes = Field(default_factory=HotPrefixes)

    @classmethod
    def load(cls, path: Path | None) -> RouterConfig:
        if path is None:
            return cls()
        return cls.model_validate(json.loads(path.read_text()))
