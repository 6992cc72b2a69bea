"""The router's route table and request plans, on plain data:

- every route real vLLM 0.32 serves (its recorded `Route:` lines) is in the
  table, proxied or refused with a reason;
- chat, Responses and Messages requests with one system prompt share their
  routing text's prefix hashes; hot prefixes and warm-up see them as chat;
- a response id names its replica: requests for it are pinned there, and a
  404 names why when that replica is gone or the id is not the router's.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from shoal.router.prefix import prefix_key
from shoal.router.routes import _BY_KEY, ROUTES, Plan, Refusal, Routing, plan
from shoal.router.shapes import Shape, routing_text
from shoal.router.stored import new_response_id, replica_tag, tag_of
from shoal.warmup.prompts import from_object
from tests.sim_fixtures import text

SYSTEM = "You answer questions about the tides of the northern sea, briefly. " * 3
REPLICAS = ("uid-a", "uid-b", "uid-c")


def route(method: str, path: str) -> Any:
    return _BY_KEY[(method, path)]


def test_every_route_real_vllm_serves_is_proxied_or_refused() -> None:
    served = set()
    for line in text("routes.txt").splitlines():
        path, _, methods = line.partition(", Methods: ")
        for method in methods.split(", "):
            if method != "HEAD":
                served.add((method, path))
    assert served - set(_BY_KEY) == set()
    refused = [r for r in ROUTES if r.routing is Routing.REFUSED]
    assert all(r.note for r in refused)


def test_one_system_prompt_has_one_prefix_whichever_api_sends_it() -> None:
    chat = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"}]}
    responses = {"instructions": SYSTEM, "input": [{"role": "user", "content": "b"}]}
    messages = {
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "c"}]}],
    }
    keys = [
        prefix_key(routing_text(shape, body), block_chars=64, max_blocks=64)
        for shape, body in ((Shape.CHAT, chat), (Shape.RESPONSES, responses),
                            (Shape.MESSAGES, messages))
    ]  # fmt: skip
    shared = len(SYSTEM) // 64
    assert shared >= 3
    assert keys[0].hashes[:shared] == keys[1].hashes[:shared] == keys[2].hashes[:shared]


def test_hot_prefixes_and_warm_up_take_responses_and_messages_as_chat() -> None:
    responses = {"model": "m", "instructions": SYSTEM, "input": "hi"}
    got = plan(route("POST", "/v1/responses"), responses, match={}, query={}, replica_ids=())
    assert isinstance(got, Plan) and got.cache_aware
    chat_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    assert got.hot_body == {"messages": chat_messages}
    for request in (responses, {"model": "m", "system": SYSTEM,
                                "messages": [{"role": "user", "content": "hi"}]}):  # fmt: skip
        path, body = from_object(request).request("m")
        assert path == "/v1/chat/completions" and body["messages"] == chat_messages


def test_utilities_are_routed_anywhere_and_not_counted_as_prefixes() -> None:
    body = {"model": "m", "prompt": SYSTEM}
    got = plan(route("POST", "/tokenize"), body, match={}, query={}, replica_ids=REPLICAS)
    assert isinstance(got, Plan)
    assert (got.cache_aware, got.hot_body, got.pinned) == (False, None, None)


def test_a_response_id_names_its_replica() -> None:
    made = new_response_id("uid-b")
    assert tag_of(made) == replica_tag("uid-b") and tag_of("resp_8a5ca4d01a9da2c2") is None
    get = route("GET", "/v1/responses/{response_id}")
    got = plan(get, {}, match={"response_id": made}, query={}, replica_ids=REPLICAS)
    assert isinstance(got, Plan) and got.pinned == "uid-b"
    assert got.excluded(REPLICAS) == {"uid-a", "uid-c"}
    follow = {"model": "m", "input": "more", "previous_response_id": made}
    got = plan(route("POST", "/v1/responses"), follow, match={}, query={}, replica_ids=REPLICAS)
    assert isinstance(got, Plan) and got.pinned == "uid-b"
    sent = json.loads(got.payload(json.dumps(follow).encode(), "uid-b"))
    assert tag_of(sent["request_id"]) == replica_tag("uid-b")
    assert {k: v for k, v in sent.items() if k != "request_id"} == follow


def test_a_responses_body_is_sent_on_with_its_numbers_as_they_came() -> None:
    """The router reads bodies with orjson, which makes integers beyond 64
    bits floats; the one body it re-encodes keeps them."""
    body = {"model": "m", "input": "hi", "metadata": {"n": 2**70 + 1, "x": 0.1}}
    raw = json.dumps(body).encode()
    read = orjson.loads(raw)  # as the proxy reads it
    assert read["metadata"]["n"] != 2**70 + 1
    got = plan(route("POST", "/v1/responses"), read, match={}, query={}, replica_ids=REPLICAS)
    assert isinstance(got, Plan)
    sent = json.loads(got.payload(raw, "uid-a"))
    assert sent["metadata"] == {"n": 2**70 + 1, "x": 0.1}


@pytest.mark.parametrize(
    "raw",
    [
        # orjson reads nesting to depth 1024, Python's json (the engine's
        # reader) past the router's recursion limit it cannot read again.
        b'{"model": "m", "input": "hi", "metadata": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"model": "m", "input": "hi", "request_id": "the client\'s own"}  \n',
        '{"model": "m", "input": "h\u00e9"}'.encode("utf-16"),  # json reads UTF-16 too
    ],
    ids=["deep", "own request_id", "utf-16"],
)
def test_a_responses_body_names_its_replica_however_deep_or_encoded(raw: bytes) -> None:
    got = plan(
        route("POST", "/v1/responses"), {"model": "m"}, match={}, query={}, replica_ids=REPLICAS
    )
    assert isinstance(got, Plan)
    sent = got.payload(raw, "uid-a")
    # Read as the engine reads it (a repeated name's last value wins); Python's
    # json cannot read the deep one from here either, orjson can.
    decoded = json.loads(sent) if raw.startswith(b"\xff\xfe") else orjson.loads(sent)
    assert tag_of(decoded["request_id"]) == replica_tag("uid-a")
    assert decoded["model"] == "m" and decoded["input"] in ("hi", "h\u00e9")


@pytest.mark.parametrize(
    ("response_id", "why"),
    [
        (new_response_id("uid-gone"), "the replica that stored it is gone"),
        ("resp_8a5ca4d01a9da2c2", "it was not made through this router"),
    ],
)
def test_a_response_nobody_here_holds_is_not_found(response_id: str, why: str) -> None:
    get = route("GET", "/v1/responses/{response_id}")
    got = plan(get, {}, match={"response_id": response_id}, query={}, replica_ids=REPLICAS)
    assert got == Refusal(404, f"Response with id '{response_id}' not found: {why}.", "response_id")
    follow = {"model": "m", "input": "x", "previous_response_id": response_id}
    got = plan(route("POST", "/v1/responses"), follow, match={}, query={}, replica_ids=REPLICAS)
    assert isinstance(got, Refusal) and got.param == "previous_response_id"
