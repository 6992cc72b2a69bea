"""The router's dispatch answers each method and path as aiohttp's
Application did with the same routes (recorded from it on session 27's
tree, before the router left it):

- table routes go to the proxy, `{response_id}` decoded as aiohttp decoded
  it; refused ones are 404s saying why;
- a table path asked with another method is a 405 naming its methods (HEAD
  included); the router's own GET routes take HEAD;
- anything else, a trailing slash or an encoded slash included, is a 404.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from multidict import CIMultiDict

from shoal.router.dispatch import Dispatch, Proxied
from shoal.router.incoming import Answer, Handler, Incoming


def _request(method: str, path: str) -> Incoming:
    """A request with no body, as the server hands one to a handler."""

    async def drained() -> None:
        return None

    return Incoming(
        method=method,
        path=path,
        query_string="",
        version="1.1",
        headers=CIMultiDict(),
        remote="127.0.0.1",
        keep_alive=True,
        max_body=0,
        transport=asyncio.Transport(),
        drain=drained,
    )


async def _answered(target: Handler, method: str, path: str) -> Answer:
    return await target(_request(method, path))


async def _own(_: Incoming) -> web.Response:
    return web.Response(text="own")


DISPATCH = Dispatch(own={"/health": _own, "/v1/models": _own})


@pytest.mark.parametrize(
    ("method", "path", "route_path", "match"),
    [
        ("POST", "/v1/completions", "/v1/completions", {}),
        ("POST", "/v1/%63ompletions", "/v1/completions", {}),  # path_safe decodes it
        ("GET", "/version", "/version", {}),
        ("POST", "/v1/responses/render", "/v1/responses/render", {}),  # not an id
        ("GET", "/v1/responses/abc", "/v1/responses/{response_id}", {"response_id": "abc"}),
        ("GET", "/v1/responses/a%2Fb", "/v1/responses/{response_id}", {"response_id": "a/b"}),
        ("GET", "/v1/responses/a%25b", "/v1/responses/{response_id}", {"response_id": "a%b"}),
        ("GET", "/v1/responses/a b", "/v1/responses/{response_id}", {"response_id": "a b"}),
        (
            "POST",
            "/v1/responses/abc/cancel",
            "/v1/responses/{response_id}/cancel",
            {"response_id": "abc"},
        ),
    ],
)
def test_table_routes_go_to_the_proxy_with_their_values(
    method: str, path: str, route_path: str, match: dict[str, str]
) -> None:
    # The server passes yarl's path_safe: percent-decoded but for %2F and %25.
    safe = path.replace("%63", "c").replace("%20", " ")
    target = DISPATCH.resolve(method, safe)
    assert isinstance(target, Proxied), target
    assert (target.route.method, target.route.path, dict(target.match)) == (
        method,
        route_path,
        match,
    )


def _answer(method: str, path: str) -> web.Response:
    target = DISPATCH.resolve(method, path)
    assert not isinstance(target, Proxied), target
    answer = asyncio.run(_answered(target, method, path))
    assert isinstance(answer, web.Response)
    return answer


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/completions", "POST"),
        ("HEAD", "/v1/completions", "POST"),
        ("OPTIONS", "/v1/completions", "POST"),
        ("HEAD", "/version", "GET"),
        ("PUT", "/ping", "GET, POST"),
        ("HEAD", "/ping", "GET, POST"),
        ("DELETE", "/v1/responses/abc", "GET"),
        ("GET", "/v1/responses/abc/cancel", "POST"),
        ("GET", "/v1/responses/render", "POST"),
    ],
)
def test_a_table_path_with_another_method_is_405_naming_its_methods(
    method: str, path: str, allow: str
) -> None:
    answer = _answer(method, path)
    assert (answer.status, answer.headers["Allow"]) == (405, allow)
    assert answer.text is not None and json.loads(answer.text)["error"]["code"] == 405


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("GET", "/"),
        ("POST", "/v1/completions/"),
        ("POST", "//v1/completions"),
        ("POST", "/v1/chat%2Fcompletions"),
        ("GET", "/v1/responses/"),
        ("GET", "/health/.."),
        ("POST", "/health"),  # the router's own routes: GET and HEAD only
        ("PUT", "/v1/models"),
        ("GET", "/hot-prefixes"),  # the internal port's
    ],
)
def test_anything_else_is_404(method: str, path: str) -> None:
    answer = _answer(method, path)
    assert answer.status == 404 and "Allow" not in answer.headers
    assert answer.text is not None
    assert json.loads(answer.text)["error"]["message"] == "Not found."


def test_refused_routes_say_why() -> None:
    for method in ("GET", "POST"):
        answer = _answer(method, "/ping")
        assert answer.status == 404 and answer.text is not None
        message = json.loads(answer.text)["error"]["message"]
        assert message.startswith("/ping is not served by shoal's router: SageMaker's"), message


def test_the_routers_own_get_routes_take_head() -> None:
    for method in ("GET", "HEAD"):
        assert DISPATCH.resolve(method, "/health") is _own
        assert DISPATCH.resolve(method, "/v1/models") is _own


def test_without_the_table_nothing_is_proxied() -> None:
    """The internal port: its own routes only."""
    internal = Dispatch(own={"/hot-prefixes": _own}, table=())
    assert internal.resolve("GET", "/hot-prefixes") is _own
    for method, path in (("POST", "/v1/completions"), ("GET", "/ping"), ("GET", "/health")):
        target = internal.resolve(method, path)
        assert not isinstance(target, Proxied)
        answer = asyncio.run(_answered(target, method, path))
        assert isinstance(answer, web.Response)
        assert answer.status == 404 and "Allow" not in answer.headers
