"""The control plane's one async engine client: the operator's health checks,
probes and warm-ups, `shoal probe`, `shoal warmup`, the bench and the demo.

Built on httpx: it is the declared stack of the control plane, and kr8s, the
Kubernetes client the operator is adopting, is built on httpx too, so the
operator holds one HTTP library (aiohttp stays the router's and the
simulator's server, and the router's data path has its own connections).

One `EngineClient` (one connection pool) per owner: the operator's context,
one CLI run, one benchmark run; never one per request. Every call has its own
deadline over the whole exchange, reads at most MAX_ANSWER_BYTES, and says
what went wrong as a type (`shoal.engine.errors`). The operator's other
reads (routers' /metrics and /hot-prefixes, a download's progress) go
through `get`, bounded alike.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from shoal.engine import endpoints
from shoal.engine.endpoints import MAX_ANSWER_BYTES
from shoal.engine.errors import BadAnswer, ErrorStatus, TimedOut, Unreachable
from shoal.engine.metrics import MetricsSnapshot, parse

# Short: a slow engine must not hold up the reconciliation of its cluster.
HEALTH_DEADLINE_SECONDS = 2.0
METRICS_DEADLINE_SECONDS = 3.0
CANARY_PROMPT = "shoal canary"
# Below uvicorn's 5 s keep-alive (vLLM's server), so a pooled connection is
# never one the engine is closing at that moment.
KEEPALIVE_SECONDS = 4.0


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer, read within its deadline and MAX_ANSWER_BYTES."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError if it is not, or nests deeper than
        Python's recursion limit lets it be read."""
        try:
            return json.loads(self.body)
        except RecursionError as error:
            raise ValueError("JSON nested too deep") from error


@dataclass(frozen=True)
class Usage:
    """The token counts of a completion's answer."""

    prompt_tokens: int
    completion_tokens: int


class EngineClient:
    """Calls to engines by base URL (`http://10.0.0.5:8000`); `deadline` of
    each call: seconds for the whole exchange. With `key` (engines started
    with an API key) every call sends `Authorization: Bearer <key>`: vLLM 0.32
    requires it on /v1, /v2, /inference and /cohere paths only
    (vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX), and
    ignores it elsewhere."""

    def __init__(self, *, http: httpx.AsyncClient | None = None, key: str | None = None) -> None:
        self._http = http
        self._headers = {"Authorization": f"Bearer {key}"} if key else None

    def with_key(self, key: str | None) -> EngineClient:
        """A client for engines started with `key` (None: without one) over
        this client's pool; this client's owner closes the pool."""
        return EngineClient(http=self._pool(), key=key)

    def _pool(self) -> httpx.AsyncClient:
        """The pool, made on first use."""
        if self._http is None:
            limits = httpx.Limits(
                max_connections=100,
                max_keepalive_connections=20,
                keepalive_expiry=KEEPALIVE_SECONDS,
            )
            self._http = httpx.AsyncClient(limits=limits)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def health(self, endpoint: str, *, deadline: float = HEALTH_DEADLINE_SECONDS) -> int:
        """The status /health answered: 200 while the engine can serve, 503
        once its engine core died. A hung engine still answers 200 (see the
        canary)."""
        response = await self._exchange("GET", endpoint, endpoints.HEALTH, deadline=deadline)
        return response.status

    async def metrics(
        self, endpoint: str, *, deadline: float = METRICS_DEADLINE_SECONDS
    ) -> MetricsSnapshot:
        response = await self._ok("GET", endpoint, endpoints.METRICS, deadline=deadline)
        return parse(response.text)

    async def models(
        self, endpoint: str, *, deadline: float = METRICS_DEADLINE_SECONDS
    ) -> list[str]:
        """The served model names, the first being the engine's default."""
        response = await self._ok("GET", endpoint, endpoints.MODELS, deadline=deadline)
        try:
            return [str(model["id"]) for model in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as error:
            raise BadAnswer(f"{endpoints.MODELS} answered no model list: {error!r}") from error

    async def complete(
        self, endpoint: str, *, path: str, body: dict[str, Any], deadline: float
    ) -> Usage:
        """POST a completion (path: endpoints.COMPLETIONS or CHAT_COMPLETIONS)
        and read its usage; ErrorStatus when the engine refused it."""
        response = await self._ok("POST", endpoint, path, deadline=deadline, body=body)
        try:
            usage = response.json()["usage"]
            return Usage(
                prompt_tokens=int(usage["prompt_tokens"]),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        except (ValueError, KeyError, TypeError, OverflowError) as error:
            raise BadAnswer(f"{path} answered no usage: {error!r}") from error

    async def canary(self, endpoint: str, *, model: str, deadline: float) -> None:
        """One token out of a tiny prompt, under a deadline: an engine that
        cannot do it in time is hung or saturated, whatever /health says.
        Any 200 passes; ErrorStatus otherwise."""
        body = {"model": model, "prompt": CANARY_PROMPT, "max_tokens": 1}
        await self._ok("POST", endpoint, endpoints.COMPLETIONS, deadline=deadline, body=body)

    async def tokenize(
        self, endpoint: str, *, model: str, prompt: str, deadline: float = METRICS_DEADLINE_SECONDS
    ) -> list[int]:
        body = {"model": model, "prompt": prompt}
        response = await self._ok(
            "POST", endpoint, endpoints.TOKENIZE, deadline=deadline, body=body
        )
        try:
            return [int(token) for token in response.json()["tokens"]]
        except (ValueError, KeyError, TypeError, OverflowError) as error:
            raise BadAnswer(f"{endpoints.TOKENIZE} answered no tokens: {error!r}") from error

    async def version(self, endpoint: str, *, deadline: float = METRICS_DEADLINE_SECONDS) -> str:
        response = await self._ok("GET", endpoint, endpoints.VERSION, deadline=deadline)
        try:
            return str(response.json()["version"])
        except (ValueError, KeyError, TypeError) as error:
            raise BadAnswer(f"{endpoints.VERSION} answered no version: {error!r}") from error

    async def _ok(
        self,
        method: str,
        endpoint: str,
        path: str,
        *,
        deadline: float,
        body: dict[str, Any] | None = None,
    ) -> Answer:
        response = await self._exchange(method, endpoint, path, deadline=deadline, body=body)
        if response.status != 200:
            raise ErrorStatus(path=path, status=response.status, text=response.text)
        return response

    async def _exchange(
        self,
        method: str,
        endpoint: str,
        path: str,
        *,
        deadline: float,
        body: dict[str, Any] | None = None,
    ) -> Answer:
        url = endpoint.rstrip("/") + path
        return await self._read(method, url, path, deadline=deadline, body=body)

    async def get(self, url: str, *, deadline: float) -> Answer:
        """GET any control-plane URL (a router's /metrics, a download's
        progress) within `deadline` and MAX_ANSWER_BYTES; EngineError if not."""
        return await self._read("GET", url, url, deadline=deadline)

    async def _read(
        self,
        method: str,
        url: str,
        what: str,
        *,
        deadline: float,
        body: dict[str, Any] | None = None,
    ) -> Answer:
        try:
            # httpx's timeout bounds each phase; the deadline is over the whole
            # exchange, as an engine trickling bytes is no healthier.
            async with (
                asyncio.timeout(deadline),
                self._pool().stream(
                    method, url, json=body, headers=self._headers, timeout=deadline
                ) as response,
            ):
                read = bytearray()
                async for chunk in response.aiter_bytes():
                    read += chunk
                    if len(read) > MAX_ANSWER_BYTES:
                        raise BadAnswer(f"{what}: answer larger than {MAX_ANSWER_BYTES} bytes")
                return Answer(response.status_code, bytes(read))
        except (TimeoutError, httpx.TimeoutException) as error:
            raise TimedOut(f"{what}: no answer within {deadline:g}s") from error
        except httpx.HTTPError as error:
            raise Unreachable(f"{what}: {error!r}") from error
