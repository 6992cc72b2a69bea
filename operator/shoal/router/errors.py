"""OpenAI-style error bodies, shaped like vLLM's own (see the fixtures):
{"error": {"message", "type", "param", "code"}}, with the error class names
vLLM and the OpenAI SDKs use."""

from __future__ import annotations

import json
from http import HTTPStatus

from aiohttp import web

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "BadRequestError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


def error_response(
    status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": _TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "") + "Error"),
            "param": param,
            "code": status,
        }
    }
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )
