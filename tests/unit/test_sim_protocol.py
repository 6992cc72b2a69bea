"""Request checks, error bodies and response shapes match recorded vLLM 0.32."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal.sim import protocol as api
from shoal.sim import responses as wire
from shoal.sim.tokenizer import Tokenizer
from tests.sim_fixtures import error_fixture, json_fixture, sse_events, text

VIEW = api.ModelView(
    served_names=("tiny",),
    max_model_len=2048,
    tokenizer=Tokenizer(vocab_size=1024, bos_token_id=None),
)


def shape(value: Any) -> Any:
    """Keys (in order) and JSON types, values dropped."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return sorted({repr(shape(v)) for v in value})
    return type(value).__name__


def error_of(call: Any) -> api.ApiError:
    with pytest.raises(api.ApiError) as caught:
        call()
    return caught.value


def test_unknown_model_is_404_with_vllms_body() -> None:
    expected, status = error_fixture("error.unknown_model.txt")
    e = error_of(lambda: api.parse_generation({"model": "nope", "prompt": "x"}, VIEW, chat=False))
    assert (e.body(), e.status) == (expected, status)


def test_malformed_json_is_400_naming_the_offset() -> None:
    expected, status = error_fixture("error.bad_json.txt")
    raw = b'{"model": "tiny", "prompt": "hello", "x": }'
    assert raw.index(b"}", 30) == 42  # the fixture's request broke at offset 42
    e = error_of(lambda: api.parse_body(raw))
    assert (e.body(), e.status) == (expected, status)


def test_max_tokens_over_the_context_is_400() -> None:
    expected, status = error_fixture("error.too_long.txt")
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 99999}
    e = error_of(lambda: api.parse_generation(body, VIEW, chat=False))
    assert (e.body(), e.status) == (expected, status)


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"prompt": "hi", "max_tokens": "x"}, "body.max_tokens", "'type': 'int_parsing'"),
        ({"prompt": "hi", "stream": "maybe"}, "body.stream", "'type': 'bool_parsing'"),
        ({"max_tokens": 3}, "prompt", "Either prompt or prompt_embeds must be provided"),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens", "max_tokens must be at least 1, got -1"),
        ({"prompt": list(range(5, 2053))}, "max_tokens", "max_tokens must be at least 1, got 0"),
        ({"prompt": list(range(5, 2100))}, "input_tokens", "contains 2095 input tokens"),
        ({"prompt": "abc " * 3000}, "input_text", "contains 12000 characters"),
        ({"prompt": list(range(5, 2048))}, None, "Token id 2047 is out of vocabulary"),
        (
            {"prompt": "hi", "stream_options": {"include_usage": True}},
            "stream_options",
            "only be defined when `stream=True`",
        ),
    ],
)
def test_bad_requests_are_400_with_vllms_param_and_message(
    body: dict[str, Any], param: str | None, fragment: str
) -> None:
    e = error_of(lambda: api.parse_generation(body, VIEW, chat=False))
    assert e.status == 400
    assert e.param == param
    assert fragment in e.message


def test_chat_without_messages_is_a_validation_error() -> None:
    e = error_of(lambda: api.parse_generation({"model": "tiny", "max_tokens": 3}, VIEW, chat=True))
    assert e.body()["error"] == {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
        "'msg': 'Field required', 'input': '<dict of 2 items>'}",
        "type": "Bad Request",
        "param": "body.messages",
        "code": 400,
    }


def test_max_tokens_defaults_to_the_rest_of_the_context() -> None:
    gen = api.parse_generation({"prompt": list(range(20, 120))}, VIEW, chat=False)
    assert gen.max_tokens == 2048 - 100 and gen.model == "tiny"


def choice(text: str = "er", finish: str = "length", tokens: int = 8) -> wire.Choice:
    return wire.Choice(index=0, text=text, finish_reason=finish, num_tokens=tokens)


def test_completion_response_has_vllms_exact_shape() -> None:
    recorded = json_fixture("completion.json")
    ours = wire.completion_response(
        rid="cmpl-aacc941baaa71097",
        created=recorded["created"],
        model="tiny",
        choices=[choice()],
        prompt_tokens=5,
        fingerprint="vllm-0.32.0-fdc1d62e",
    )
    assert ours == recorded


def test_chat_response_has_vllms_exact_shape() -> None:
    recorded = json_fixture("chat.json")
    ours = wire.chat_response(
        rid=recorded["id"],
        created=recorded["created"],
        model="tiny",
        choices=[choice(text="", tokens=4)],
        prompt_tokens=19,
        fingerprint="vllm-0.32.0-fdc1d62e",
    )
    assert ours == recorded
    assert list(ours) == list(recorded)


def encode_stream(chat: bool, deltas: list[tuple[str, str | None]], prompt_len: int) -> list[Any]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": len(deltas), "stream": True}
    body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = list(range(20, 20 + prompt_len))
    gen = api.parse_generation(body, VIEW, chat=chat)
    encoder = wire.StreamEncoder(gen, fingerprint="vllm-0.32.0-fdc1d62e", created=1796015767)
    raw = b"".join(encoder.start())
    for text_delta, finish in deltas:
        raw += encoder.delta(index=0, text=text_delta, num_tokens=1, finish_reason=finish)
    raw += b"".join(encoder.end())
    return sse_events(raw.decode())


def test_completion_stream_matches_the_recorded_chunks() -> None:
    recorded = sse_events(text("completion.stream.txt"))
    ours = encode_stream(False, [("", None)] * 3 + [("", "length")], prompt_len=3)
    rid = recorded[0]["id"]
    for event in ours[:-1]:
        event["id"] = rid
    assert ours == recorded


def test_chat_stream_has_the_recorded_chunk_shapes() -> None:
    recorded = sse_events(text("chat.stream.txt"))
    ours = encode_stream(True, [("", None)] * 3 + [("", "length")], prompt_len=0)
    assert [shape(e) for e in ours] == [shape(e) for e in recorded]
    assert ours[-1] == "[DONE]"
    assert ours[-2]["usage"]["completion_tokens"] == 4


def test_without_include_usage_the_finishing_chunk_carries_the_fingerprint() -> None:
    gen = api.parse_generation({"prompt": "hi", "max_tokens": 1, "stream": True}, VIEW, chat=False)
    encoder = wire.StreamEncoder(gen, fingerprint="fp")
    raw = encoder.delta(index=0, text=" ba", num_tokens=1, finish_reason="length")
    raw += b"".join(encoder.end())
    events = sse_events(raw.decode())
    assert events[0]["system_fingerprint"] == "fp"
    assert events[1:] == ["[DONE]"]


def test_tokenize_and_models_have_the_recorded_shapes() -> None:
    recorded = json.loads(text("tokenize.txt").split("\nHTTP ")[0])
    tokens = api.parse_tokenize({"model": "tiny", "prompt": "Hello, world"}, VIEW)
    ours = wire.tokenize_response(tokens, max_model_len=2048)
    assert shape(ours) == shape(recorded)
    assert ours["count"] == len(tokens) == 4  # "Hello" "," " worl" "d"
    models = json_fixture("v1_models.json")
    ours = wire.models_response(
        names=("tiny",),
        root="/models/tiny",
        max_model_len=2048,
        created=models["data"][0]["created"],
    )
    ours["data"][0]["permission"][0]["id"] = models["data"][0]["permission"][0]["id"]
    assert ours == models


ALIASED = api.ModelView(
    served_names=("tiny", "alias2"),
    max_model_len=2048,
    tokenizer=Tokenizer(vocab_size=1024, bos_token_id=None),
)


@pytest.mark.parametrize("chat", [False, True])
def test_an_alias_is_answered_with_the_first_served_name(chat: bool) -> None:
    """vLLM's OpenAIServingModels.model_name(): the first --served-model-name."""
    body: dict[str, Any] = {"model": "alias2", "max_tokens": 1, "stream": True}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    gen = api.parse_generation(body, ALIASED, chat=chat)
    assert gen.model == "tiny"
    encoder = wire.StreamEncoder(gen, fingerprint="fp")
    raw = b"".join(encoder.start())
    raw += encoder.delta(index=0, text="", num_tokens=1, finish_reason="length")
    assert {event["model"] for event in sse_events(raw.decode())} == {"tiny"}


UNSUPPORTED_MEDIA_TYPE = {
    "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
    "type": "Bad Request",
    "param": None,
    "code": 400,
}


@pytest.mark.parametrize(
    ("content_type", "raw"),
    [
        (None, b'{"prompt": "x"}'),
        (None, b'{"prompt": }'),  # not even decoded without a JSON content type
        ("text/plain", b'{"prompt": "x"}'),
        ("application/json ; charset=utf-8", b'{"prompt": "x"}'),
        ("application/vnd.api+json", b'{"prompt": "x"}'),
        (None, b""),
    ],
)
def test_a_body_not_typed_application_json_is_refused(content_type: str | None, raw: bytes) -> None:
    """vLLM's validate_json_request, checked after FastAPI has decoded
    JSON-typed bodies (as recorded from FastAPI 0.136 with vLLM's handlers)."""
    e = error_of(lambda: api.parse_request_body(raw, content_type=content_type))
    assert (e.status, e.body()["error"]) == (400, UNSUPPORTED_MEDIA_TYPE)


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON", "application/json; charset=utf-8"]
)
def test_application_json_in_any_case_and_with_parameters_is_accepted(content_type: str) -> None:
    assert api.parse_request_body(b'{"prompt": "x"}', content_type=content_type) == {"prompt": "x"}


def test_a_malformed_body_typed_as_json_fails_to_decode_before_its_type_is_checked() -> None:
    e = error_of(lambda: api.parse_request_body(b'{"x": }', content_type="application/x+json"))
    assert e.param == "body.6" and "json_invalid" in e.message


def test_an_empty_json_body_is_a_missing_body() -> None:
    e = error_of(lambda: api.parse_request_body(b"", content_type="application/json"))
    assert e.body()["error"] == {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body', "
        "'msg': 'Field required', 'input': 'None'}",
        "type": "Bad Request",
        "param": "body",
        "code": 400,
    }


@pytest.mark.parametrize(
    ("body", "chat", "message"),
    [
        ({"model": "nope"}, False, "Either prompt or prompt_embeds must be provided"),
        ({"model": "nope", "max_tokens": "x"}, False, "Either prompt or prompt_embeds"),
        (
            {"model": "nope", "prompt": "x", "stream_options": {"include_usage": True}},
            False,
            "Stream options can only be defined when `stream=True`.",
        ),
        ({"prompt": "x", "stream_options": 5}, False, "Stream options can only be defined"),
        (
            {"model": "nope", "max_tokens": "x", "stream_options": {"include_usage": True}},
            True,
            "Stream options can only be defined",
        ),
        ({"model": "nope"}, True, "'loc': 'body.messages', 'msg': 'Field required'"),
    ],
)
def test_the_requests_own_checks_come_before_the_model_check(
    body: dict[str, Any], chat: bool, message: str
) -> None:
    """vLLM's request models check these (pydantic before-validators, then
    field types) before its serving layer looks the model up (as recorded
    from FastAPI 0.136 with vLLM's request models and handlers)."""
    e = error_of(lambda: api.parse_generation(body, VIEW, chat=chat))
    assert e.status == 400
    assert message in e.message


@pytest.mark.parametrize("chat", [False, True])
def test_an_empty_model_is_the_default_one(chat: bool) -> None:
    """vLLM's _is_model_supported: an empty name is no name."""
    body: dict[str, Any] = {"model": "", "max_tokens": 1}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    assert api.parse_generation(body, ALIASED, chat=chat).model == "tiny"


def test_continuous_usage_counts_each_choice_against_its_own_prompt() -> None:
    """vLLM's completion stream: a chunk's usage is its prompt's tokens and
    the tokens its choice has generated so far; the final usage sums them."""
    body = {
        "prompt": [[20, 21, 22], [30, 31]],
        "n": 2,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    encoder = wire.StreamEncoder(api.parse_generation(body, VIEW, chat=False), fingerprint="fp")
    raw = b"".join(
        encoder.delta(index=i, text="", num_tokens=k, finish_reason=None)
        for i, k in [(0, 1), (1, 2), (2, 1), (3, 1), (0, 2), (3, 3)]
    )
    raw += b"".join(encoder.end())
    usages = [
        (e["usage"]["prompt_tokens"], e["usage"]["completion_tokens"])
        for e in sse_events(raw.decode())[:-1]
    ]
    assert usages == [(3, 1), (3, 2), (2, 1), (2, 1), (3, 3), (2, 4), (5, 10)]


def test_continuous_usage_of_a_chat_with_n_choices_is_per_choice() -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    gen = api.parse_generation(body, VIEW, chat=True)
    prompt = len(gen.prompts[0])
    encoder = wire.StreamEncoder(gen, fingerprint="fp")
    raw = b"".join(encoder.start())
    for i, k in [(0, 1), (1, 1), (0, 1)]:
        raw += encoder.delta(index=i, text="", num_tokens=k, finish_reason=None)
    usages = [e["usage"]["completion_tokens"] for e in sse_events(raw.decode())]
    assert usages == [0, 0, 1, 1, 2]
    assert {e["usage"]["prompt_tokens"] for e in sse_events(raw.decode())} == {prompt}
