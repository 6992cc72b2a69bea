"""vLLM's other APIs through the router, driven by the official `openai` and
`anthropic` clients as their users drive them:

- chat, completions, the Responses API (plain and streamed) and Anthropic's
  Messages API (plain, streamed, count_tokens) answer through the router what
  the engine answers directly;
- a stored response is retrieved, and continued with `previous_response_id`,
  through a second router replica that never saw it (the replica is named in
  the id); a response whose replica is gone is the client's NotFoundError;
- a system prompt shared by chat, Responses and Messages requests lands on
  one replica (one cache);
- a Responses request is retried on another replica when the first fails
  before answering; one pinned to stored state is not;
- a client leaving a Responses stream aborts the engine's request;
- tokenize, detokenize and render answer as the engine does; refused paths
  are OpenAI-shaped 404s saying why.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from shoal.sim.apis_app import STORE_ENV
from tests.integration.procs import MODEL, engine_metric, router, set_fault, sims

SYSTEM = "You are the reference librarian of a small town; answer briefly. " * 3


@pytest.fixture(autouse=True)
def _store_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    # The engines store responses only when told, as vLLM does.
    monkeypatch.setenv(STORE_ENV, "1")


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def an(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=30)


def _same(value: Any) -> Any:
    """A body with what differs between two identical requests (ids, times) blanked."""
    if isinstance(value, dict):
        return {
            k: "X" if k in ("id", "item_id", "created", "created_at") else _same(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_same(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"(resp|msg|chatcmpl|cmpl)[_-][0-9a-f]+", "X", value)
    return value


def test_openai_client_gets_the_same_answers_through_the_router(tmp_path: Path) -> None:
    with sims(2, tmp_path) as urls, router(urls, tmp_path) as front:
        direct, routed = oa(urls[0]), oa(front)
        for client in (direct, routed):
            assert [m.id for m in client.models.list()] == [MODEL]
        chat: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
        }
        a, b = (c.chat.completions.create(**chat) for c in (direct, routed))
        assert _same(a.model_dump()) == _same(b.model_dump())
        a, b = (
            c.completions.create(model=MODEL, prompt="once", max_tokens=5) for c in (direct, routed)
        )
        assert _same(a.model_dump()) == _same(b.model_dump())
        request: dict[str, Any] = {
            "model": MODEL,
            "instructions": SYSTEM,
            "input": "a book?",
            "max_output_tokens": 6,
        }
        a, b = (c.responses.create(**request) for c in (direct, routed))
        assert _same(a.model_dump()) == _same(b.model_dump())
        assert b.output_text == a.output_text and b.output_text
        streamed = []
        for client in (direct, routed):
            with client.responses.stream(**request) as events:
                kinds = [e.type for e in events]
                streamed.append((kinds, events.get_final_response().output_text))
        assert streamed[0] == streamed[1]
        assert streamed[1][0][0] == "response.created" and streamed[1][1] == a.output_text
        with pytest.raises(openai.NotFoundError):
            routed.responses.create(model="nope", input="x")


def test_anthropic_client_gets_the_same_answers_through_the_router(tmp_path: Path) -> None:
    with sims(2, tmp_path) as urls, router(urls, tmp_path) as front:
        direct, routed = an(urls[0]), an(front)
        request: dict[str, Any] = {
            "model": MODEL,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": "a book?"}],
            "max_tokens": 6,
        }
        a, b = (c.messages.create(**request) for c in (direct, routed))
        assert _same(a.model_dump()) == _same(b.model_dump())
        assert b.content[0].text
        streamed = []
        for client in (direct, routed):
            with client.messages.stream(**request) as stream:
                text = "".join(stream.text_stream)
                streamed.append((text, stream.get_final_message().usage.output_tokens))
        assert streamed[0] == streamed[1] == (b.content[0].text, b.usage.output_tokens)
        counted = [
            c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=request["messages"])
            for c in (direct, routed)
        ]
        assert counted[0].input_tokens == counted[1].input_tokens == b.usage.input_tokens
        with pytest.raises(anthropic.NotFoundError):
            routed.messages.create(**{**request, "model": "nope"})


@pytest.fixture
def two_routers(tmp_path: Path) -> Iterator[tuple[list[str], str, str]]:
    with (
        sims(3, tmp_path) as urls,
        router(urls, tmp_path, name="router-a") as a,
        router(urls, tmp_path, name="router-b") as b,
    ):
        yield list(urls), a, b


def test_stored_responses_are_found_through_another_router_replica(
    two_routers: tuple[list[str], str, str],
) -> None:
    _, front_a, front_b = two_routers
    a, b = oa(front_a), oa(front_b)
    for i in range(6):  # each on its own replica by its prompt: never one by luck
        made = a.responses.create(model=MODEL, input=f"question {i} " * 20, max_output_tokens=4)
        found = b.responses.retrieve(made.id)
        assert found.model_dump() == made.model_dump()
        follow = b.responses.create(
            model=MODEL, input="and then?", previous_response_id=made.id, max_output_tokens=4
        )
        assert follow.previous_response_id == made.id
        # The engine's own usage shows the earlier turn was part of the prompt.
        fresh = b.responses.create(model=MODEL, input="and then?", max_output_tokens=4)
        assert follow.usage is not None and fresh.usage is not None
        assert follow.usage.input_tokens > fresh.usage.input_tokens
        assert a.responses.retrieve(follow.id).id == follow.id
        with pytest.raises(openai.BadRequestError, match="synchronous"):
            b.responses.cancel(made.id)


def test_a_response_whose_replica_is_gone_is_not_found(tmp_path: Path) -> None:
    with sims(2, tmp_path) as urls, router(urls, tmp_path, name="router-a") as front:
        made = oa(front).responses.create(model=MODEL, input="remember me", max_output_tokens=4)
        holder = httpx.get(front + "/v1/responses/" + made.id, timeout=10).headers[
            "x-shoal-replica"
        ]
        survivors = [u for u in urls if not u.endswith(holder)]
        # A router that no longer has that replica (its pod replaced or removed).
        with router(survivors, tmp_path, name="router-b") as other:
            with pytest.raises(openai.NotFoundError, match="replica that stored it is gone"):
                oa(other).responses.retrieve(made.id)
            with pytest.raises(openai.NotFoundError, match="replica that stored it is gone"):
                oa(other).responses.create(model=MODEL, input="more", previous_response_id=made.id)
            with pytest.raises(openai.NotFoundError, match="not made through this router"):
                oa(other).responses.retrieve("resp_nope")


def test_a_system_prompt_shared_across_apis_lands_on_one_replica(tmp_path: Path) -> None:
    # The prefix policy: placement by what replicas hold alone (cache-aware
    # also weighs the load a scrape saw mid-request, which this is not about).
    config = {"policy": "prefix"}
    with sims(4, tmp_path) as urls, router(urls, tmp_path, config=config) as front:
        for topic in ("tides", "owls", "glass", "maps", "salt"):
            system = f"You explain {topic} to children in short sentences. " * 10
            where = {
                httpx.post(
                    front + "/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": "why?"},
                        ],
                        "max_tokens": 2,
                    },
                    timeout=30,
                ).headers["x-shoal-replica"],
                httpx.post(
                    front + "/v1/responses",
                    json={"model": MODEL, "instructions": system, "input": "how?",
                          "max_output_tokens": 2},
                    timeout=30,
                ).headers["x-shoal-replica"],
                httpx.post(
                    front + "/v1/messages",
                    json={"model": MODEL, "system": system, "max_tokens": 2,
                          "messages": [{"role": "user", "content": "when?"}]},
                    timeout=30,
                ).headers["x-shoal-replica"],
            }  # fmt: skip
            assert len(where) == 1, f"{topic}: one system prompt on {where}"


def test_a_failing_replica_is_skipped_unless_the_request_is_pinned_to_it(
    tmp_path: Path,
) -> None:
    with sims(2, tmp_path) as urls, router(urls, tmp_path) as front:
        client = oa(front)
        made = client.responses.create(model=MODEL, input="keep this", max_output_tokens=4)
        holder = httpx.get(front + "/v1/responses/" + made.id, timeout=10).headers[
            "x-shoal-replica"
        ]
        failing = next(u for u in urls if u.endswith(holder))
        set_fault(failing, error_rate=1.0)
        for i in range(4):
            answer = client.responses.create(model=MODEL, input=f"new {i}", max_output_tokens=2)
            assert answer.output_text is not None
        with pytest.raises(openai.InternalServerError):
            client.responses.create(
                model=MODEL, input="more", previous_response_id=made.id, max_output_tokens=2
            )


def test_leaving_a_responses_stream_aborts_the_engine_request(tmp_path: Path) -> None:
    with sims(1, tmp_path, time_scale=1.0) as urls, router(urls, tmp_path) as front:
        first: list[bytes] = []

        def stream_then_quit() -> None:
            with httpx.stream(
                "POST",
                front + "/v1/responses",
                timeout=30,
                json={"model": MODEL, "input": "a long story", "max_output_tokens": 2000,
                      "stream": True},
            ) as response:  # fmt: skip
                assert response.status_code == 200
                for chunk in response.iter_raw():
                    first.append(chunk)
                    break

        worker = threading.Thread(target=stream_then_quit)
        worker.start()
        worker.join(timeout=30)
        assert first and first[0].startswith(b"event: response.created")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if engine_metric(urls[0], "vllm:num_requests_running") == 0:
                break
            time.sleep(0.2)
        assert engine_metric(urls[0], "vllm:num_requests_running") == 0
        assert engine_metric(urls[0], "vllm:generation_tokens_total") < 2000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"model": MODEL, "prompt": "hello world"}),
        ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
        ("/detokenize", {"model": MODEL, "tokens": [100, 200]}),
        ("/v1/chat/completions/render", {"model": MODEL, "messages": []}),
        ("/v1/completions/render", {"model": MODEL, "prompt": "x"}),
        ("/v1/embeddings", {"model": MODEL, "input": "x"}),
    ],
)
def test_utilities_answer_as_the_engine_does(tmp_path: Path, path: str, body: Any) -> None:
    with sims(1, tmp_path) as urls, router(urls, tmp_path) as front:
        direct = httpx.post(urls[0] + path, json=body, timeout=10)
        routed = httpx.post(front + path, json=body, timeout=10)
        assert (routed.status_code, routed.json()) == (direct.status_code, direct.json())


def test_refused_and_unknown_paths_are_openai_shaped_404s(tmp_path: Path) -> None:
    with sims(1, tmp_path) as urls, router(urls, tmp_path) as front:
        refused = httpx.get(front + "/load", timeout=10)
        assert refused.status_code == 404
        assert "one engine's load" in refused.json()["error"]["message"]
        assert refused.json()["error"]["type"] == "NotFoundError"
        unknown = httpx.post(front + "/v1/nope", json={}, timeout=10)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404
        wrong = httpx.post(front + "/v1/responses/resp_x", timeout=10)
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
