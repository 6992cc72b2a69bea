"""Over HTTP, a `shoal sim` engine answers as the recorded vLLM 0.32 did."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.sim_proc import sim
from tests.sim_fixtures import (
    error_fixture,
    json_fixture,
    parse_exposition,
    sse_events,
    text,
    value,
)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sim(tmp_path_factory.mktemp("sim"), "--sim-time-scale", "10") as (_, base):
        yield base


def shape(v: Any) -> Any:
    if isinstance(v, dict):
        return [(k, shape(x)) for k, x in v.items()]
    if isinstance(v, list):
        return sorted({repr(shape(x)) for x in v})
    return type(v).__name__


def post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def test_health_has_uvicorns_headers_and_an_empty_body(url: str) -> None:
    response = httpx.get(f"{url}/health")
    assert response.status_code == 200
    assert response.content == b""
    recorded = {
        line.split(":")[0].lower()
        for line in text("health.headers.txt").splitlines()[1:]
        if line.strip()
    }
    assert recorded <= {k.lower() for k in response.headers}
    assert response.headers["server"] == "uvicorn"
    assert "content-type" not in response.headers


def test_version_and_models(url: str) -> None:
    assert httpx.get(f"{url}/version").json() == json_fixture("version.json")
    models = httpx.get(f"{url}/v1/models").json()
    assert shape(models) == shape(json_fixture("v1_models.json"))
    assert (models["data"][0]["id"], models["data"][0]["max_model_len"]) == ("tiny", 2048)


def test_plain_completion_and_chat_have_vllms_shapes(url: str) -> None:
    completion = post(url, "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 8})
    assert completion.headers["content-type"] == "application/json"
    assert shape(completion.json()) == shape(json_fixture("completion.json"))
    assert completion.json()["usage"]["completion_tokens"] == 8
    chat = post(
        url,
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert shape(chat.json()) == shape(json_fixture("chat.json"))


@pytest.mark.parametrize(
    ("path", "fixture", "body"),
    [
        ("/v1/completions", "completion.stream.txt", {"prompt": "hey", "max_tokens": 4}),
        (
            "/v1/chat/completions",
            "chat.stream.txt",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        ),
    ],
)
def test_streams_have_vllms_chunks_and_done(
    url: str, path: str, fixture: str, body: dict[str, Any]
) -> None:
    body = {**body, "model": "tiny", "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=30) as response:
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        raw = response.read().decode()
    ours, recorded = sse_events(raw), sse_events(text(fixture))
    assert [shape(e) for e in ours] == [shape(e) for e in recorded]
    assert ours[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("fixture", "raw"),
    [
        ("error.unknown_model.txt", b'{"model": "nope", "prompt": "x"}'),
        ("error.bad_json.txt", b'{"model": "tiny", "prompt": "hello", "x": }'),
        ("error.too_long.txt", b'{"model": "tiny", "prompt": "x", "max_tokens": 99999}'),
    ],
)
def test_errors_have_vllms_bodies_and_codes(url: str, fixture: str, raw: bytes) -> None:
    response = httpx.post(
        f"{url}/v1/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert (response.json(), response.status_code) == error_fixture(fixture)


def test_unknown_routes_answer_like_fastapi(url: str) -> None:
    assert httpx.get(f"{url}/nope").json() == {"detail": "Not Found"}
    response = httpx.post(f"{url}/version")
    assert (response.status_code, response.json()) == (405, {"detail": "Method Not Allowed"})


def test_metrics_families_match_and_prefix_hits_count_whole_blocks(url: str) -> None:
    response = httpx.get(f"{url}/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = parse_exposition(response.text)[0]
    assert families == parse_exposition(text("metrics.idle.txt"))[0]

    def counter(name: str) -> float:
        return value(parse_exposition(httpx.get(f"{url}/metrics").text)[1], name)

    prompt = list(range(300, 900))
    hits = counter("vllm:prefix_cache_hits_total")
    queries = counter("vllm:prefix_cache_queries_total")
    post(url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 2})
    post(url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 2})
    assert counter("vllm:prefix_cache_queries_total") - queries == 1200
    assert counter("vllm:prefix_cache_hits_total") - hits == 512  # 4 blocks of 128, not 600
    assert counter("vllm:kv_cache_usage_perc") == 0.0  # idle, though the blocks stay cached


def test_tokenize_counts_tokens(url: str) -> None:
    body = post(url, "/tokenize", {"model": "tiny", "prompt": "Hello, world"}).json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 2048


def test_sim_flags_serve_a_second_engine_in_the_same_process(tmp_path: Path) -> None:
    from tests.integration.sim_proc import free_ports

    port, extra = free_ports(2)
    with sim(tmp_path, "--sim-listen", f"127.0.0.1:{extra}", port=port) as (process, first):
        second = f"http://127.0.0.1:{extra}"
        process.wait_healthy(second)
        post(first, "/v1/completions", {"model": "tiny", "prompt": [5] * 50, "max_tokens": 3})

        def prompt_tokens(base: str) -> float:
            return value(
                parse_exposition(httpx.get(f"{base}/metrics").text)[1], "vllm:prompt_tokens_total"
            )

        assert (prompt_tokens(first), prompt_tokens(second)) == (50.0, 0.0)


def test_a_chat_stream_sends_its_role_chunk_only_with_the_first_output(tmp_path: Path) -> None:
    """vLLM writes the headers at once but the role chunk only with the
    engine's first output, so a client's (and the router's) first byte of
    body marks the end of prefill. A hung engine shows it plainly."""
    with sim(tmp_path, "--sim-fault-api") as (_, url):
        httpx.post(f"{url}/_sim/fault", json={"hang": True}).raise_for_status()
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 2,
            "stream": True,
        }
        with httpx.Client(timeout=httpx.Timeout(5.0, read=1.0)) as client:
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                chunks = response.iter_raw()
                with pytest.raises(httpx.ReadTimeout):
                    next(chunks)
            httpx.post(f"{url}/_sim/fault", json={"hang": False}).raise_for_status()
            response = client.post(f"{url}/v1/chat/completions", json=body)
        first = sse_events(response.text)[0]
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_every_api_answers_an_alias_with_the_first_served_name(tmp_path: Path) -> None:
    """vLLM names its first --served-model-name in every answer, whichever
    alias the client asked for."""
    with sim(tmp_path, "--served-model-name", "tiny", "alias2") as (_, url):
        messages = [{"role": "user", "content": "hi"}]
        answers = [
            post(url, "/v1/completions", {"model": "alias2", "prompt": "hi", "max_tokens": 2}),
            post(url, "/v1/chat/completions", {"model": "alias2", "messages": messages}),
            post(url, "/v1/responses", {"model": "alias2", "input": "hi", "max_output_tokens": 2}),
            post(url, "/v1/messages", {"model": "alias2", "messages": messages, "max_tokens": 2}),
        ]
        assert [a.json()["model"] for a in answers] == ["tiny"] * 4
        stream = {"model": "alias2", "prompt": "hi", "max_tokens": 2, "stream": True}
        events = sse_events(post(url, "/v1/completions", stream).text)
        assert {e["model"] for e in events[:-1]} == {"tiny"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/tokenize", {"prompt": "hi"}),
        ("/detokenize", {"tokens": [5, 6]}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ],
)
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_a_body_not_sent_as_application_json_is_refused(
    url: str, path: str, body: dict[str, Any], content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    raw = json.dumps(body).encode()
    response = httpx.post(f"{url}{path}", content=raw, headers=headers, timeout=30)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "1 validation error:\n  Unsupported Media Type: "
            "Only 'application/json' is allowed",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
    }
