"""OpenAI-style error bodies, shaped like vLLM's own (see the fixtures):
{"error": {"message", "type", "param", "code"}}, with the error class names
vLLM and the OpenAI SDKs use."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from aiohttp import web

from shoal.router.incoming import Answer, Handler, Incoming

log = logging.getLogger("shoal.router")

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "BadRequestError",
    415: "BadRequestError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "") + "Error"),
            "param": param,
            "code": status,
        }
    }


def error_response(
    status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(status, message, param=param)),
        content_type="application/json",
        headers=headers,
    )


def sse_error(status: int, message: str) -> bytes:
    """The error event that ends a stream broken off after its first byte:
    OpenAI's SDKs raise an APIError on an event whose data has `error`; the
    leading blank lines end any event the engine left cut short."""
    return b"\n\ndata: %s\n\ndata: [DONE]\n\n" % json.dumps(error_body(status, message)).encode()


def internal_error(request: Incoming, error: Exception) -> web.Response:
    """A router bug's answer: an OpenAI-shaped 500 and one log line (the
    traceback only at DEBUG), instead of aiohttp's plain-text 500."""
    log.error(
        "%s %s failed: %s: %s",
        request.method,
        request.path,
        type(error).__name__,
        str(error)[:200],
        exc_info=error if log.isEnabledFor(logging.DEBUG) else None,
    )
    return error_response(500, "The router failed on this request.")


def guarded(handler: Handler) -> Handler:
    """`handler`, answering `internal_error` for any exception it lets out."""

    async def guarded_handler(request: Incoming) -> Answer:
        try:
            return await handler(request)
        except Exception as error:
            return internal_error(request, error)

    return guarded_handler
