"""The simulated engine's Responses and Messages routes (and the render
routes, refused as vLLM refuses them without --enable-scale-out).

Like vLLM, stored responses are kept only with VLLM_ENABLE_RESPONSES_API_STORE=1
in the environment (in this engine's memory, never evicted, as vLLM's); a
Responses request's `request_id` is its response id.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from shoal.sim import apis
from shoal.sim import protocol as api
from shoal.sim.engine import EngineDeadError, RequestStream
from shoal.sim.responses import request_id
from shoal.sim.scheduler import Status

if TYPE_CHECKING:
    from shoal.sim.app import EngineApp

STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
SCALE_OUT_PATHS = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/responses/render",
    "/v1/messages/render",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
)
_EVENT_STREAM = {"Content-Type": "text/event-stream; charset=utf-8"}


@dataclass
class Stored:
    response: api.JsonDict
    messages: list[api.JsonDict]  # the conversation, with the answer, for a next turn


class OtherApis:
    def __init__(self, app: EngineApp) -> None:
        self.app = app
        self.store_enabled = os.environ.get(STORE_ENV, "") == "1"
        self.stored: dict[str, Stored] = {}

    # -- shared ------------------------------------------------------------------

    def _gen(self, messages: list[api.JsonDict], *, model: object, max_tokens: object,
             stream: bool) -> api.GenerationRequest:  # fmt: skip
        chat = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}
        return api.parse_generation(chat, self.app.view, chat=True)

    async def _run(
        self, gen: api.GenerationRequest
    ) -> AsyncIterator[tuple[str, int, RequestStream]]:
        """(text, tokens, stream) per engine output of a one-choice request."""
        (stream,) = self.app._submit(gen)
        self.app.in_flight += 1
        try:
            async for tokens in stream.deltas():
                yield self.app.engine.tokenizer.decode(tokens), len(tokens), stream
        except EngineDeadError as e:
            raise api.server_error(str(e)) from None
        finally:
            self.app.in_flight -= 1
            stream.abort()

    @staticmethod
    def _finish(stream: RequestStream) -> str | None:
        seq = stream.seq
        return seq.finish_reason if seq.status is Status.FINISHED else None

    # -- Responses -----------------------------------------------------------------

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        previous_id = body.get("previous_response_id")
        previous: list[api.JsonDict] = []
        if previous_id is not None:
            found = self.stored.get(str(previous_id))
            if found is None:
                raise apis.response_not_found(str(previous_id))
            previous = found.messages
        messages = apis.responses_messages(body, previous)
        stream = bool(body.get("stream"))
        gen = self._gen(
            messages, model=body.get("model"), max_tokens=body.get("max_output_tokens"),
            stream=stream,
        )  # fmt: skip
        draft = apis.ResponseDraft(
            rid=apis.response_id(body),
            body=body,
            model=gen.model,
            prompt_tokens=len(gen.prompts[0]),
        )
        if not stream:
            async for text, count, seq in self._run(gen):
                draft.text += text
                draft.output_tokens += count
                draft.finish_reason = self._finish(seq)
            self._store(body, draft, messages)
            return _json(draft.response(done=True))
        response = web.StreamResponse(headers=_EVENT_STREAM)
        await response.prepare(request)
        started = False
        async for text, count, seq in self._run(gen):
            if not started:
                started = True
                for event in draft.start_events():
                    await response.write(event)
            draft.finish_reason = self._finish(seq)
            await response.write(draft.delta_event(text, count))
        for event in draft.end_events():
            await response.write(event)
        self._store(body, draft, messages)
        await response.write_eof()
        return response

    def _store(self, body: api.JsonDict, draft: apis.ResponseDraft,
               messages: list[api.JsonDict]) -> None:  # fmt: skip
        if self.store_enabled and body.get("store", True):
            turn = [*messages, {"role": "assistant", "content": draft.text}]
            self.stored[draft.rid] = Stored(response=draft.response(done=True), messages=turn)

    async def retrieve_response(self, request: web.Request) -> web.StreamResponse:
        rid = request.match_info["response_id"]
        found = self.stored.get(rid)
        if found is None:
            raise apis.response_not_found(rid)
        return _json(found.response)

    async def cancel_response(self, request: web.Request) -> web.StreamResponse:
        rid = request.match_info["response_id"]
        found = self.stored.get(rid)
        if found is None:
            raise apis.response_not_found(rid)
        raise apis.cannot_cancel()  # only background responses are cancelled; none are here

    # -- Messages ------------------------------------------------------------------

    def _messages_gen(self, body: api.JsonDict, *, stream: bool) -> api.GenerationRequest:
        if body.get("max_tokens") is None:
            raise api.validation_error(
                [
                    {
                        "type": "missing",
                        "loc": "body.max_tokens",
                        "msg": "Field required",
                        "input": f"<dict of {len(body)} items>",
                    }
                ]
            )
        try:
            return self._gen(
                apis.messages_chat(body), model=body.get("model"),
                max_tokens=body.get("max_tokens"), stream=stream,
            )  # fmt: skip
        except api.ApiError as e:
            raise apis.AnthropicError(
                e.status, e.message, err_type=e.err_type, param=e.param
            ) from None

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        stream = bool(body.get("stream"))
        gen = self._messages_gen(body, stream=stream)
        mid = request_id(chat=True)
        prompt_tokens = len(gen.prompts[0])
        text, output, finish = "", 0, None
        if not stream:
            async for piece, count, seq in self._run(gen):
                text, output, finish = text + piece, output + count, self._finish(seq)
            usage = {"input_tokens": prompt_tokens, "output_tokens": output}
            return _json(
                apis.message_response(
                    mid=mid, model=gen.model, text=text, finish_reason=finish, usage=usage
                )
            )
        response = web.StreamResponse(headers=_EVENT_STREAM)
        await response.prepare(request)
        started = False
        async for piece, count, seq in self._run(gen):
            if not started:
                started = True
                for event in apis.message_start(
                    mid=mid, model=gen.model, input_tokens=prompt_tokens
                ):
                    await response.write(event)
            output, finish = output + count, self._finish(seq)
            await response.write(apis.message_delta(piece))
        usage = {"input_tokens": prompt_tokens, "output_tokens": output}
        for event in apis.message_end(finish_reason=finish, usage=usage):
            await response.write(event)
        await response.write_eof()
        return response

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        try:
            tokens = api.parse_tokenize(
                {"model": body.get("model"), "messages": apis.messages_chat(body)},
                self.app.view,
            )
        except api.ApiError as e:
            raise apis.AnthropicError(
                e.status, e.message, err_type=e.err_type, param=e.param
            ) from None
        return _json(apis.count_tokens_response(len(tokens)))

    async def scale_out(self, _: web.Request) -> web.StreamResponse:
        raise apis.scale_out_disabled()


async def _read_json(request: web.Request) -> api.JsonDict:
    from shoal.sim.app import read_json  # app.py imports this module

    return await read_json(request)


def _json(body: object) -> web.Response:
    from shoal.sim.app import json_response  # app.py imports this module

    return json_response(body)
