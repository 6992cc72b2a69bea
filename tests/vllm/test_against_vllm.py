"""What a client or a router sees of real vLLM 0.32 and of `shoal sim`,
given the same requests: endpoints, bodies, chunks, errors, metrics."""

from __future__ import annotations

import time
import warnings
from typing import Any

import httpx
import pytest

from tests.sim_fixtures import parse_exposition, sse_events, value
from tests.vllm.conftest import Server

Pair = tuple[Server, Server]
PROMPT_600 = [(7 * k) % 900 + 50 for k in range(600)]


def shape(v: Any) -> Any:
    if isinstance(v, dict):
        return [(k, shape(x)) for k, x in v.items()]
    if isinstance(v, list):
        return sorted({repr(shape(x)) for x in v})
    return type(v).__name__


def call(
    server: Server, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> httpx.Response:
    kwargs: dict[str, Any] = {"timeout": 120}
    if raw is not None:
        kwargs |= {"content": raw, "headers": {"content-type": "application/json"}}
    elif body is not None:
        kwargs["json"] = body
    return httpx.request(method, f"{server.url}{path}", **kwargs)


def on_both(
    both: Pair, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[httpx.Response, httpx.Response]:
    real, sim = both
    return call(real, method, path, body, raw), call(sim, method, path, body, raw)


def metrics(server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return parse_exposition(httpx.get(f"{server.url}/metrics").text)[1]


def settled(server: Server, name: str, want: float, timeout: float = 5.0) -> float:
    """A metric's value once it reaches `want` (vLLM's stats arrive a step late)."""
    deadline = time.monotonic() + timeout
    got = value(metrics(server), name)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = value(metrics(server), name)
    return got


def test_both_refuse_connections_while_loading(both: Pair) -> None:
    real, sim = both
    assert real.refused_while_loading and sim.refused_while_loading


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/health", None),
        ("GET", "/ping", None),
        ("POST", "/ping", None),
        ("GET", "/version", None),
        ("POST", "/version", None),
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("GET", "/load", None),
        ("GET", "/nope", None),
        ("GET", "/v1/completions", None),
        ("POST", "/tokenize", {"model": "tiny", "prompt": "hello"}),
        ("POST", "/detokenize", {"model": "tiny", "tokens": [100, 200]}),
        ("POST", "/v1/completions", {"model": "tiny", "prompt": [100, 200], "max_tokens": 2}),
        (
            "POST",
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    ],
)
def test_same_endpoints_same_status_and_content_type(
    both: Pair, method: str, path: str, body: Any
) -> None:
    real, sim = on_both(both, method, path, body)
    assert sim.status_code == real.status_code
    assert sim.headers.get("content-type") == real.headers.get("content-type")
    if real.headers.get("content-type") == "application/json" and path not in (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
    ):
        assert sim.json() == real.json()


def test_health_headers(both: Pair) -> None:
    real, sim = on_both(both, "GET", "/health")
    assert {k.lower() for k in sim.headers} == {k.lower() for k in real.headers}
    assert sim.headers["server"] == real.headers["server"] == "uvicorn"


def test_models_and_tokenize_shapes(both: Pair) -> None:
    real, sim = on_both(both, "GET", "/v1/models")
    assert shape(sim.json()) == shape(real.json())
    for key in ("id", "root", "max_model_len", "owned_by"):
        assert sim.json()["data"][0][key] == real.json()["data"][0][key]
    real, sim = on_both(both, "POST", "/tokenize", {"model": "tiny", "prompt": "hello world"})
    assert shape(sim.json()) == shape(real.json())


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("n_prompts", [1, 2])
def test_plain_responses_have_the_same_shape_and_usage(
    both: Pair, chat: bool, n_prompts: int
) -> None:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 5, "ignore_eos": True}
    if chat:
        body |= {"messages": [{"role": "user", "content": "hi"}], "n": n_prompts}
        path = "/v1/chat/completions"
    else:
        body["prompt"] = [[100, 200, 300]] * n_prompts if n_prompts > 1 else [100, 200, 300]
        path = "/v1/completions"
    real, sim = on_both(both, "POST", path, body)
    assert shape(sim.json()) == shape(real.json())
    assert len(sim.json()["choices"]) == len(real.json()["choices"]) == n_prompts
    assert sim.json()["usage"]["completion_tokens"] == real.json()["usage"]["completion_tokens"]
    if not chat:
        assert sim.json()["usage"] == real.json()["usage"]


def stream(server: Server, path: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as response:
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        return sse_events(response.read().decode())


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    "options",
    [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}],
)
def test_streams_have_the_same_chunk_shapes(both: Pair, chat: bool, options: Any) -> None:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "ignore_eos": True, "stream": True}
    if options:
        body["stream_options"] = options
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = [100, 200, 300]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    real, sim = (stream(server, path, body) for server in both)
    assert real[-1] == sim[-1] == "[DONE]"
    # vLLM may merge tokens into fewer chunks; the kinds of chunk must agree.
    assert shape(sim[0]) == shape(real[0])
    assert shape(sim[-2]) == shape(real[-2])
    assert {repr(shape(e)) for e in sim[:-1]} == {repr(shape(e)) for e in real[:-1]}


ERROR_CASES: list[tuple[str, dict[str, Any] | bytes]] = [
    ("/v1/completions", {"model": "nope", "prompt": "x"}),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hello", "x": }'),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 99999}),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": -1}),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "many"}),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "stream": "maybe"}),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 0}),
    ("/v1/completions", {"model": "tiny", "max_tokens": 3}),
    ("/v1/completions", {"model": "tiny", "prompt": list(range(5, 2100))}),
    ("/v1/completions", {"model": "tiny", "prompt": list(range(5, 2053))}),
    ("/v1/completions", {"model": "tiny", "prompt": [5, 6, 5000], "max_tokens": 2}),
    ("/v1/completions", {"model": "tiny", "prompt": "abc def " * 1500, "max_tokens": 2}),
    (
        "/v1/completions",
        {"model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}},
    ),
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "nope", "messages": []}),
]


@pytest.mark.parametrize(("path", "request_body"), ERROR_CASES)
def test_errors_have_the_same_code_and_body(
    both: Pair, path: str, request_body: dict[str, Any] | bytes
) -> None:
    if isinstance(request_body, bytes):
        real, sim = on_both(both, "POST", path, raw=request_body)
    else:
        real, sim = on_both(both, "POST", path, request_body)
    assert real.status_code >= 400
    assert (sim.status_code, sim.json()) == (real.status_code, real.json())


def test_metric_families_are_the_same(both: Pair) -> None:
    real, sim = (parse_exposition(httpx.get(f"{s.url}/metrics").text)[0] for s in both)
    assert sim == real


# cache_config_info labels whose value vLLM's CPU build takes from the host CPU,
# not from the flags: with AVX512-BF16 it resets the SSM cache dtype to float32
# (vllm/platforms/cpu.py), without it (e.g. AMD EPYC Milan) it stays "auto". The
# simulator reports what the fixtures' CPU (with AVX512-BF16) showed.
_HOST_CPU_LABELS = frozenset({"mamba_ssm_cache_dtype"})


def test_engine_series_and_labels_are_the_same(both: Pair) -> None:
    def engine_series(server: Server) -> set[tuple[str, frozenset[tuple[str, str]]]]:
        return {
            (name, frozenset((k, v) for k, v in labels if k not in _HOST_CPU_LABELS))
            for name, labels in metrics(server)
            if name.startswith("vllm:")
        }

    real, sim = both
    assert engine_series(sim) == engine_series(real)


def test_prefix_hits_count_whole_blocks_on_both(both: Pair) -> None:
    for server in both:
        before = metrics(server)
        hits0 = value(before, "vllm:prefix_cache_hits_total")
        queries0 = value(before, "vllm:prefix_cache_queries_total")
        for _ in range(2):
            body = {"model": "tiny", "prompt": PROMPT_600, "max_tokens": 2, "ignore_eos": True}
            assert call(server, "POST", "/v1/completions", body).status_code == 200
        queries = settled(server, "vllm:prefix_cache_queries_total", queries0 + 1200)
        assert queries - queries0 == 1200, server.name
        # floor((600 - 1) / 128) * 128: whole blocks, never the last token.
        assert value(metrics(server), "vllm:prefix_cache_hits_total") - hits0 == 512, server.name


def test_kv_usage_rises_while_running_and_returns_to_zero(both: Pair) -> None:
    import threading

    for server in both:
        body = {
            "model": "tiny",
            "prompt": PROMPT_600[:100],
            "max_tokens": 1900,
            "ignore_eos": True,
        }

        def post(target: Server, request: dict[str, Any]) -> None:
            httpx.post(f"{target.url}/v1/completions", json=request, timeout=300)

        # Not streamed: real vLLM's API server answers /metrics only between
        # the SSE events it writes, and three streams of this tiny model keep
        # its event loop busy until they end (a scrape took the whole 2-8 s
        # run, measured). Its gauges also lag the engine under load, so scrape
        # while any request runs, keep every answer, and try again, up to five
        # rounds, until a round saw a request running.
        seen: list[tuple[float, float]] = []
        for _ in range(5):
            workers = [threading.Thread(target=post, args=(server, body)) for _ in range(3)]
            for worker in workers:
                worker.start()
            seen = []
            while any(worker.is_alive() for worker in workers):
                samples = metrics(server)
                seen.append(
                    (
                        value(samples, "vllm:num_requests_running"),
                        value(samples, "vllm:kv_cache_usage_perc"),
                    )
                )
            for worker in workers:
                worker.join()
            if any(running >= 1 for running, _ in seen):
                break
        observed = any(running >= 1 for running, _ in seen)
        if server.name == "vllm" and not observed:
            # On these 2 cores real vLLM's engine can starve its API server
            # until generation ends (a scrape then spans the whole run): the
            # rise went unobserved, not absent. The return to 0 is still checked.
            warnings.warn(f"real vLLM answered no scrape mid-run: {seen}", stacklevel=1)
        else:
            assert observed, (server.name, seen)
            assert max(usage for _, usage in seen) > 0, (server.name, seen)
        assert settled(server, "vllm:kv_cache_usage_perc", 0.0) == 0.0, server.name
        assert settled(server, "vllm:num_requests_running", 0.0) == 0.0, server.name


def test_http_series_are_the_same_after_the_same_requests(both: Pair) -> None:
    """Runs last: by now both servers got the same requests (scrapes of
    /metrics and /health are not counted by either)."""

    def http_series(server: Server) -> set[tuple[str, frozenset[tuple[str, str]]]]:
        return {
            key
            for key in metrics(server)
            if key[0].startswith("http_") and not key[0].endswith("_created")
        }

    real, sim = both
    assert http_series(sim) == http_series(real)
