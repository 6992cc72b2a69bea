"""What `make bench-router`'s wrk sends, the instant upstream answering it, and
each router's CPU per request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import RawTestServer, TestClient, TestServer

from shoal.bench.instant_upstream import build_app
from shoal.bench.router_http import _cpu_per_request, workload_request
from shoal.bench.server_floor import (
    ANSWER,
    Answering,
    AnsweringTasked,
    answer,
    answering_app,
)
from shoal.bench.workloads import GENERATORS
from shoal.engine.endpoints import CHAT_COMPLETIONS


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_a_workloads_request_goes_out_whole_unstreamed_and_one_token_long(name: str) -> None:
    request = workload_request(name)
    body = json.loads(request.body)
    assert body["stream"] is False
    assert body["max_tokens"] == 1
    assert "stream_options" not in body
    # wrk's script holds the body in a Lua long string, which this would end.
    assert b"]==]" not in request.body


def test_a_shared_prefix_request_is_a_chat_with_a_long_system_prompt() -> None:
    request = workload_request("shared-prefix")
    body = json.loads(request.body)
    assert request.path == CHAT_COMPLETIONS
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert len(request.body) > 8_000


def test_the_instant_upstream_answers_a_chat_completion_at_once() -> None:
    async def call() -> tuple[int, dict[str, object]]:
        async with TestClient(TestServer(build_app(chunks=1, interval=0.0))) as client:
            response = await client.post(
                CHAT_COMPLETIONS, data=workload_request("shared-prefix").body
            )
            return response.status, await response.json()

    status, answer = asyncio.run(call())
    assert status == 200
    assert answer["object"] == "chat.completion"


def test_each_router_is_charged_its_own_cpu_per_request() -> None:
    """Direct and shoal's rounds read the shoal process's CPU, a peer's its own."""
    cpu = {"router_cpu": 0.5, "smg:cache_aware_cpu": 0.9}
    runs: dict[str, list[dict[str, Any]]] = {
        "direct": [{**cpu, "requests_per_second": 20_000.0}],
        "router": [{**cpu, "requests_per_second": 5_000.0}],
        "smg:cache_aware": [{**cpu, "requests_per_second": 6_000.0}],
    }
    _cpu_per_request(runs)
    charged = {name: rounds[0]["router_cpu_us_per_request"] for name, rounds in runs.items()}
    assert charged == {"direct": 25.0, "router": 100.0, "smg:cache_aware": 150.0}


def test_the_floor_servers_answer_each_request_of_a_kept_alive_connection() -> None:
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
    )
    body = b'{"model": "m", "prompt": "hi", "max_tokens": 1}'
    whole = request % (len(body), body)

    async def exchange(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(whole)
        writer.write(whole[:-5])  # the second request's body in two writes
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(whole[-5:])
        answers = b""
        while answers.count(ANSWER) < 2:
            answers += await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
        return answers

    async def run() -> list[bytes]:
        loop = asyncio.get_running_loop()
        bare = await loop.create_server(Answering, "127.0.0.1", 0)
        tasked = await loop.create_server(AnsweringTasked, "127.0.0.1", 0)
        async with (
            TestServer(answering_app()) as served,
            RawTestServer(answer) as low,
        ):
            assert served.port is not None and low.port is not None
            answered = [
                await exchange(served.port),
                await exchange(low.port),
                await exchange(bare.sockets[0].getsockname()[1]),
                await exchange(tasked.sockets[0].getsockname()[1]),
            ]
        bare.close()
        tasked.close()
        return answered

    for answers in asyncio.run(run()):
        assert answers.count(b"HTTP/1.1 200 OK") == 2
        assert answers.count(ANSWER) == 2
