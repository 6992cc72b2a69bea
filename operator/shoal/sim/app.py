"""The HTTP face of one simulated engine: vLLM 0.32's OpenAI server routes.

An aiohttp application per engine (many share one event loop). Responses
carry uvicorn's `server` header and the `vary: Origin` vLLM's CORS middleware
adds; unknown routes answer FastAPI's `{"detail": ...}` bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import hdrs, web

from shoal.sim import protocol as api
from shoal.sim import responses as wire
from shoal.sim.apis_app import SCALE_OUT_PATHS, OtherApis
from shoal.sim.auth import OUTSIDE_CORS, key_check
from shoal.sim.engine import Engine, EngineDeadError, RequestStream
from shoal.sim.faults import FAULT_PATH, refuse_seconds
from shoal.sim.metrics import HTTP_EXCLUDED
from shoal.sim.scheduler import ParentRequest, Status

# A sample line's value (comment lines start with '#'): what the "nan" and
# "negative" faults replace.
_SAMPLE_VALUE = re.compile(rb"^([^#\n][^\n]*) \S+$", re.MULTILINE)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VERSION_BODY = {"version": "0.32.0"}


class EngineApp:
    def __init__(
        self,
        engine: Engine,
        *,
        on_crash: Callable[[], None],
        on_refuse: Callable[[float], None] | None = None,
    ) -> None:
        self.engine = engine
        self.config = engine.config
        self.on_crash = on_crash
        self.on_refuse = on_refuse
        self.view = api.ModelView(
            served_names=self.config.names,
            max_model_len=self.config.resolved_max_model_len,
            tokenizer=engine.tokenizer,
        )
        self.fingerprint = self.config.system_fingerprint()
        self.in_flight = 0
        # vLLM's drain (SIGTERM with --shutdown-timeout): new requests fail,
        # those in flight run on.
        self.shutting_down = False

    def build(self) -> web.Application:
        # The key check is vLLM's outermost middleware: its 401s are not in /metrics.
        keys = [key_check(self.config.api_keys)] if self.config.api_keys else []
        app = web.Application(
            middlewares=[self._connections, *keys, self._http_metrics, self._errors]
        )
        r = app.router
        r.add_get("/health", self.health, allow_head=False)
        r.add_route("*", "/ping", self.health)
        r.add_get("/version", self.version, allow_head=False)
        r.add_get("/load", self.load, allow_head=False)
        r.add_get("/v1/models", self.models, allow_head=False)
        r.add_get("/metrics", self.metrics, allow_head=False)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        other = OtherApis(self)
        r.add_post("/v1/responses", other.create_response)
        r.add_get("/v1/responses/{response_id}", other.retrieve_response, allow_head=False)
        r.add_post("/v1/responses/{response_id}/cancel", other.cancel_response)
        r.add_post("/v1/messages", other.messages)
        r.add_post("/v1/messages/count_tokens", other.count_tokens)
        for path in SCALE_OUT_PATHS:
            r.add_post(path, other.scale_out)
        if self.config.fault_api:
            r.add_route("*", FAULT_PATH, self.fault)
        app.on_response_prepare.append(self._uvicorn_headers)
        return app

    # -- middleware --------------------------------------------------------------

    @staticmethod
    async def _uvicorn_headers(_: web.Request, response: web.StreamResponse) -> None:
        response.headers["server"] = "uvicorn"
        if not response.get(OUTSIDE_CORS):
            response.headers["vary"] = "Origin"

    @web.middleware
    async def _connections(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The "reset" fault: drop the connection with a TCP RST, no response;
        "silent": no response at all, until the client gives up."""
        mode = self.engine.faults.connections
        if mode == "ok" or request.path == FAULT_PATH:
            return await handler(request)
        if mode == "silent":
            await asyncio.Event().wait()  # until the client leaves (handler_cancellation)
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    # Linger 0: close() sends RST instead of FIN.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        # The lost connection cancels this handler (handler_cancellation); the
        # answer below is never written.
        await asyncio.sleep(1.0)
        return web.Response(status=503)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except api.ApiError as e:
            return json_response(e.body(), status=e.status)
        except web.HTTPMethodNotAllowed as e:
            allow = ", ".join(sorted(e.allowed_methods))
            return json_response(
                {"detail": "Method Not Allowed"}, status=405, headers={"allow": allow}
            )
        except web.HTTPNotFound:
            return json_response({"detail": "Not Found"}, status=404)

    @web.middleware
    async def _http_metrics(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        response = await handler(request)
        resource = request.match_info.route.resource
        if resource is not None:
            handler_name = resource.canonical
        else:
            # Unmatched, or a 405: vLLM's instrumentator counts these as "none",
            # except on the paths it skips.
            handler_name = request.path if request.path in HTTP_EXCLUDED else "none"
        self.engine.metrics.http.observe(
            handler=handler_name,
            method=request.method,
            status=response.status,
            request_bytes=request.content_length or 0,
            response_bytes=response.content_length or 0,
            seconds=time.perf_counter() - started,
        )
        return response

    # -- plain endpoints -----------------------------------------------------------

    async def health(self, _: web.Request) -> web.StreamResponse:
        return web.Response(status=503 if self.engine.dead else 200)

    async def version(self, _: web.Request) -> web.StreamResponse:
        return json_response(VERSION_BODY)

    async def load(self, _: web.Request) -> web.StreamResponse:
        load = self.in_flight if self.config.enable_server_load_tracking else 0
        return json_response({"server_load": load})

    async def models(self, _: web.Request) -> web.StreamResponse:
        return json_response(
            wire.models_response(
                names=self.config.names,
                root=self.config.model,
                max_model_len=self.view.max_model_len,
                created=int(time.time()),
            )
        )

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        mode = self.engine.faults.metrics
        if mode == "error":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "garbage":
            return web.Response(text="<html>this is not Prometheus text{{{\n")
        if mode == "hang":
            await asyncio.Event().wait()
        if self.engine.faults.metrics_seconds:
            time.sleep(self.engine.faults.metrics_seconds)  # noqa: ASYNC251 - the fault: a loop kept busy
        from prometheus_client import CONTENT_TYPE_LATEST

        body = self.engine.metrics.exposition()
        if mode == "nan":
            body = _SAMPLE_VALUE.sub(rb"\1 NaN", body)
        if mode == "negative":
            body = _SAMPLE_VALUE.sub(rb"\1 -7", body)
        if mode == "endless":
            return await _endless(request, body, content_type=CONTENT_TYPE_LATEST)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        tokens = api.parse_tokenize(body, self.view)
        return json_response(wire.tokenize_response(tokens, max_model_len=self.view.max_model_len))

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise api.validation_error(
                [
                    {
                        "type": "missing" if tokens is None else "list_type",
                        "loc": "body.tokens",
                        "msg": "Field required" if tokens is None else "Input should be a list",
                        "input": f"<dict of {len(body)} items>",
                    }
                ]
            )
        return json_response({"prompt": self.engine.tokenizer.decode(tokens)})

    async def fault(self, request: web.Request) -> web.StreamResponse:
        """GET: the faults in force; POST {"hang": true, "error_rate": 0.5,
        "slowness": 3, "metrics": "error", "crash": true}: change them."""
        if request.method == "POST":
            body = api.parse_body(await request.read())
            crash = bool(body.pop("crash", False))
            hang = body.pop("hang", None)
            refuse = body.pop("refuse_seconds", None)
            try:
                refuse_for = None if refuse is None else refuse_seconds(refuse)
                self.engine.faults.update(body if hang is None else {**body, "hang": hang})
            except ValueError as e:
                raise api.bad_request(str(e)) from None
            if hang is not None:
                self.engine.set_hang(bool(hang))
            if crash:
                self.on_crash()
            if refuse_for is not None and self.on_refuse is not None:
                self.on_refuse(refuse_for)
        elif request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        return json_response({**self.engine.faults.as_dict(), "dead": self.engine.dead})

    # -- generation -----------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        poison = self.engine.faults.poison
        if poison and poison.encode() in raw:
            raise api.server_error("Simulated request error (poison)")
        body = api.parse_request_body(raw, content_type=request.headers.get(hdrs.CONTENT_TYPE))
        gen = api.parse_generation(body, self.view, chat=chat)
        streams = self._submit(gen)
        self.in_flight += 1
        try:
            if gen.stream:
                return await self._stream(request, gen, streams)
            return await self._complete(gen, streams)
        except EngineDeadError as e:
            raise api.server_error(str(e)) from None
        finally:
            self.in_flight -= 1
            for stream in streams:
                stream.abort()  # a no-op once finished; frees KV if the client left

    def _submit(self, gen: api.GenerationRequest) -> list[RequestStream]:
        """The request's sequences, started (or the engine's failure)."""
        engine = self.engine
        rate = engine.faults.error_rate
        if engine.dead:
            raise api.server_error(EngineDeadError.MESSAGE)
        if self.shutting_down:
            # vLLM 0.32's words: its executor is shut down (tests/vllm compare).
            raise api.server_error("cannot schedule new futures after shutdown")
        if rate and engine.error_rng.random() < rate:
            raise api.server_error("Simulated engine error (--sim-error-rate)")
        streams = []
        for prompt in gen.prompts:
            parent = ParentRequest(n=gen.n) if gen.n > 1 else None
            streams += [
                engine.submit(
                    prompt_ids=list(prompt),
                    max_tokens=gen.max_tokens,
                    seed=gen.seed,
                    ignore_eos=gen.ignore_eos,
                    choice=k,
                    parent=parent,
                )
                for k in range(gen.n)
            ]
        return streams

    async def _complete(
        self, gen: api.GenerationRequest, streams: list[RequestStream]
    ) -> web.StreamResponse:
        async def drain(stream: RequestStream) -> None:
            async for _ in stream.deltas():
                pass

        await asyncio.gather(*(drain(s) for s in streams))
        choices = [
            wire.Choice(
                index=i,
                text=self.engine.tokenizer.decode(s.seq.output_ids),
                finish_reason=s.seq.finish_reason,
                num_tokens=s.seq.num_output,
            )
            for i, s in enumerate(streams)
        ]
        build = wire.chat_response if gen.chat else wire.completion_response
        return json_response(
            build(
                rid=wire.request_id(gen.chat),
                created=int(time.time()),
                model=gen.model,
                choices=choices,
                prompt_tokens=gen.prompt_tokens,
                fingerprint=self.fingerprint,
            )
        )

    async def _stream(
        self, request: web.Request, gen: api.GenerationRequest, streams: list[RequestStream]
    ) -> web.StreamResponse:
        encoder = wire.StreamEncoder(gen, fingerprint=self.fingerprint)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        # vLLM sends chat's role chunk with the first engine output (after
        # prefill), not with the headers: a client's TTFT starts there.
        started = False
        stall_after = self.engine.faults.stall_after
        chunks = 0
        try:
            try:
                async for i, tokens in merged(streams):
                    chunks += 1
                    if stall_after and chunks > stall_after:
                        await asyncio.Event().wait()  # the stall fault: until the client leaves
                    if not started:
                        started = True
                        for event in encoder.start():
                            await response.write(event)
                    seq = streams[i].seq
                    finish = seq.finish_reason if seq.status is Status.FINISHED else None
                    await response.write(
                        encoder.delta(
                            index=i,
                            text=self.engine.tokenizer.decode(tokens),
                            num_tokens=len(tokens),
                            finish_reason=finish,
                        )
                    )
            except EngineDeadError as e:
                await response.write(encoder.error(api.server_error(str(e))))
                await response.write(wire.sse("[DONE]"))
            else:
                for event in encoder.end():
                    await response.write(event)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left; the caller aborts the request
        return response


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, list[int]]]:
    """(choice index, new tokens) from several streams as they come."""
    if len(streams) == 1:
        async for tokens in streams[0].deltas():
            yield 0, tokens
        return
    queue: asyncio.Queue[tuple[int, list[int]] | BaseException | None] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for tokens in stream.deltas():
                queue.put_nowait((i, tokens))
        except EngineDeadError as e:
            queue.put_nowait(e)
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        done = 0
        while done < len(streams):
            item = await queue.get()
            if item is None:
                done += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def read_json(request: web.Request) -> api.JsonDict:
    """The body of one of vLLM's JSON routes."""
    raw = await request.read()
    return api.parse_request_body(raw, content_type=request.headers.get(hdrs.CONTENT_TYPE))


def json_response(
    body: object, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=wire.dumps(body).encode(),
        status=status,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


# What the "endless" metrics fault pads with: comment lines, 64 KiB a write.
_PADDING = b"# runaway exporter\n" * 3450


async def _endless(request: web.Request, scrape: bytes, *, content_type: str) -> web.StreamResponse:
    """The scrape, then comment lines until the reader goes away."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    await response.write(scrape)
    with contextlib.suppress(ConnectionError):
        while True:
            await response.write(_PADDING)  # waits while the reader's window is full
    return response
