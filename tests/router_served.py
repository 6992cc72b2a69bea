"""The router's own HTTP server (router/connections.py), as `serve` runs it
(router/app.py), listening on a free loopback port for aiohttp's TestClient."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient
from yarl import URL

from shoal.router.app import Router
from shoal.router.connections import HttpServer


class RouterTestServer(BaseTestServer):
    """TestClient's server interface over the router's server (aiohttp's
    runner, which BaseTestServer starts, serves only aiohttp's)."""

    def __init__(self, router: Router, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.router = router
        self.served: HttpServer | None = None
        self._listener: asyncio.Server | None = None

    async def start_server(
        self, loop: asyncio.AbstractEventLoop | None = None, **kwargs: Any
    ) -> None:
        if self._listener is not None:
            return
        self.served = self.router.server()
        running = asyncio.get_running_loop()
        self._listener = await running.create_server(self.served, self.host, 0)
        self.port = self._listener.sockets[0].getsockname()[1]
        self.scheme = self.scheme or "http"
        self._root = URL(f"{self.scheme}://{self.host}:{self.port}")

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        raise NotImplementedError("the router's server has no aiohttp runner")

    @property
    def started(self) -> bool:
        return self._listener is not None

    async def close(self) -> None:
        if self._listener is None or self.closed:
            return
        self._listener.close()
        assert self.served is not None
        await self.served.shutdown(1.0)
        self._root = None
        self.port = None
        self._closed = True


def router_client(router: Router) -> TestClient[web.BaseRequest, None]:
    """A TestClient of the router's server (entered, it starts it)."""
    return TestClient(RouterTestServer(router))
