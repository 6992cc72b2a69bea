"""An upstream that answers at once, for measuring the router's own cost.

Non-streamed completions and chat completions (whatever they ask) get a
small vLLM-shaped body straight away; streamed completions get `chunks` SSE
chunks `interval` seconds apart, then `[DONE]`. Each streamed chunk carries
`"t"`, the CLOCK_MONOTONIC time in nanoseconds at which it was written, so a
client on the same machine can tell how long the chunk took to reach it
(directly or through the router).
`/metrics` shows an idle engine, so the router treats it as healthy.

It runs on uvloop and does as little per chunk as it can: its cost is shared
by the direct and the routed runs, but it sits on the load generator's core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import uvloop
from aiohttp import web


def _answer(id_: str, kind: str, choice: dict[str, object]) -> bytes:
    """A one-token, vLLM-shaped answer."""
    return json.dumps(
        {
            "id": id_,
            "object": kind,
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, **choice, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "total_tokens": 5, "completion_tokens": 1},
        }
    ).encode()


_BODY = _answer("cmpl-0", "text_completion", {"text": " ok", "logprobs": None, "stop_reason": None})
_CHAT_BODY = _answer(
    "chatcmpl-0", "chat.completion", {"message": {"role": "assistant", "content": " ok"}}
)
_METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n'
)
_DONE = b"data: [DONE]\n\n"
# What a vLLM engine lists: the peer routers find their workers' model (and,
# smg, the backend's kind from owned_by) here before they route to them.
_MODELS = json.dumps(
    {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}
).encode()


def build_app(*, chunks: int, interval: float) -> web.Application:
    # The chunk text up to the timestamp, rendered once.
    heads = [
        b'data: {"id":"cmpl-0","choices":[{"index":0,"text":" t%d"}],"t":' % i
        for i in range(chunks)
    ]

    async def completions(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if b'"stream": true' not in raw and b'"stream":true' not in raw:
            return web.Response(body=_BODY, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for head in heads:
                await response.write(b"%s%d}\n\n" % (head, time.monotonic_ns()))
                await asyncio.sleep(interval)
            await response.write(_DONE)
        except ConnectionResetError:
            pass  # the caller hung up (a router aborting for its client)
        return response

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=_CHAT_BODY, content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=_METRICS, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.Response(body=_MODELS, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    web.run_app(
        build_app(chunks=args.chunks, interval=args.interval),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        backlog=1024,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
