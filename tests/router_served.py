"""aiohttp's test server on the router's own HTTP server, as `serve` runs it
(router/app.py): for TestClient, in place of an Application."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient

from shoal.router.app import Router


class RouterTestServer(BaseTestServer):
    def __init__(self, router: Router, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.router = router

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return web.ServerRunner(self.router.server(), **kwargs)


def router_client(router: Router) -> TestClient[web.BaseRequest, None]:
    """A TestClient of the router's server (entered, it starts it)."""
    return TestClient(RouterTestServer(router))
