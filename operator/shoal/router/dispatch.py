"""Which handler answers a request, from its method and path: the router's
own dispatch, in place of aiohttp's Application and UrlDispatcher.

The router serves a fixed table (router/routes.py) and a few routes of its
own, so aiohttp's application layer (a resolver walking resources, a
`web.Request` with match info, the response-prepare signal) was a cost per
request with nothing to choose: on aiohttp's low-level server the same
answer costs 6-12 us less, the router 9-14 us less at 4 connections
(docs/benchmarks.md, sessions 26 and 27). It resolves as
aiohttp did for these routes, which tests/unit/test_router_dispatch.py pins:

- paths are matched exactly as sent, percent-decoded except `%2F` and `%25`
  (yarl's `path_safe`, aiohttp's form); a `{name}` segment matches one
  non-empty segment, its value decoded in full;
- a table path asked with a method it does not serve is a 405 naming the
  methods it does (HEAD included: the table's GET routes do not take HEAD);
- the router's own GET routes take HEAD too;
- anything else is a 404.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from shoal.router.errors import error_response
from shoal.router.incoming import Handler, Incoming
from shoal.router.routes import ROUTES, Route, Routing

_SEGMENT = re.compile(r"\{([_a-zA-Z][_a-zA-Z0-9]*)\}")


@dataclass(frozen=True, slots=True)
class Proxied:
    """A request the proxy routes: the table's route and the path's values."""

    route: Route
    match: Mapping[str, str]


Target = Proxied | Handler


def _pattern(path: str) -> re.Pattern[str]:
    parts = _SEGMENT.split(path)  # literal, name, literal, name, ..., literal
    regex = "".join(
        f"(?P<{part}>[^{{}}/]+)" if i % 2 else re.escape(part) for i, part in enumerate(parts)
    )
    return re.compile(regex)


def _value(segment: str) -> str:
    """A path value as aiohttp gave it: path_safe leaves these two encoded."""
    return segment.replace("%2F", "/").replace("%25", "%")


def _refuser(route: Route) -> Handler:
    async def refused(request: Incoming) -> web.Response:
        return error_response(404, f"{request.path} is not served by shoal's router: {route.note}.")

    return refused


def _not_allowed(methods: list[str]) -> Handler:
    allow = ", ".join(methods)

    async def not_allowed(_: Incoming) -> web.Response:
        return error_response(405, "Method not allowed.", headers={"Allow": allow})

    return not_allowed


async def not_found(_: Incoming) -> web.Response:
    return error_response(404, "Not found.")


class Dispatch:
    """Method and path (`path_safe`) to what answers them."""

    def __init__(self, own: Mapping[str, Handler], *, table: Sequence[Route] = ROUTES) -> None:
        """`own`: the router's own GET routes (HEAD too), by path; the
        table's PREFIX, STORED and ANY routes go to the proxy, its REFUSED
        ones get a 404 saying why (the internal port has no table)."""
        by_path: dict[str, dict[str, Target]] = {}
        for route in table:
            if route.routing is Routing.OWN:
                continue
            targets = by_path.setdefault(route.path, {})
            refused = route.routing is Routing.REFUSED
            targets[route.method] = _refuser(route) if refused else Proxied(route, {})
        # A table path's other methods: 405 (aiohttp's "*" route, added per path).
        self._wrong_method = {path: _not_allowed(list(ms)) for path, ms in by_path.items()}
        for path, handler in own.items():
            by_path.setdefault(path, {}).update({"GET": handler, "HEAD": handler})
        self._exact = {path: targets for path, targets in by_path.items() if "{" not in path}
        self._patterns = [
            (_pattern(path), path, targets) for path, targets in by_path.items() if "{" in path
        ]

    def resolve(self, method: str, path: str) -> Target:
        targets = self._exact.get(path)
        if targets is not None:
            return targets.get(method) or self._wrong_method.get(path, not_found)
        for pattern, template, targets in self._patterns:
            found = pattern.fullmatch(path)
            if found is None:
                continue
            target = targets.get(method)
            if isinstance(target, Proxied):
                values = {name: _value(value) for name, value in found.groupdict().items()}
                return Proxied(target.route, values)
            return target or self._wrong_method.get(template, not_found)
        return not_found
