"""A Kubernetes API server stand-in on loopback, for the API client's own
requests: it records each request, answers from canned responses, accepts
only the current bearer token (401 otherwise), and streams watch events a
test feeds it. The kubeconfig it writes points kr8s at it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

Answer = tuple[int, Any]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeApiServer:
    kubeconfig: Path
    token: str = "first"
    seen: list[Seen] = field(default_factory=list)
    # (method, path) -> answer; else a PATCH echoes its body, the rest is 404.
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    # Lines each watch request streams, one queue per watch in order.
    watches: asyncio.Queue[asyncio.Queue[dict[str, Any] | None]] = field(
        default_factory=asyncio.Queue
    )
    url: str = ""

    def write_kubeconfig(self, token: str) -> None:
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": token}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )

    def requests(self, method: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.rstrip("/") == "/version":
            return web.json_response({"gitVersion": "v1.36.0"})
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"message": "Unauthorized"}, status=401)
        text = await request.text()
        self.seen.append(
            Seen(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers=dict(request.headers),
                body=json.loads(text) if text else None,
            )
        )
        if request.query.get("watch") == "true":
            return await self._watch(request)
        answer = self.answers.get((request.method, request.path))
        if answer is None and request.method == "PATCH":
            answer = (200, self.seen[-1].body)  # as if applied
        status, body = answer or (404, {"kind": "Status", "message": "not found"})
        return web.json_response(body, status=status)

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        events = await self.watches.get()
        response = web.StreamResponse()
        await response.prepare(request)
        while (event := await events.get()) is not None:
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response


@asynccontextmanager
async def fake_apiserver(tmp_path: Path) -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(kubeconfig=tmp_path / "kubeconfig")
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    server.write_kubeconfig(server.token)
    try:
        yield server
    finally:
        await runner.cleanup()
