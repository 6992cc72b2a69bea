"""Real vLLM 0.32's other APIs, beside the simulator and behind the router:

- the simulator answers the recorded requests (tests/api_exchanges.py) as
  the live real server does: statuses, shapes, errors, stream events;
- through two router replicas, the official `openai` client creates a
  response on one, retrieves it and continues it (`previous_response_id`)
  on the other, with the same answers as from vLLM directly; the official
  `anthropic` client's messages, stream and count_tokens are vLLM's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.api_exchanges import SYSTEM, USER, same_shape, send_all
from tests.integration.procs import router
from tests.vllm.conftest import Server

Pair = tuple[Server, Server]


def test_the_simulator_answers_the_other_apis_as_vllm_does(both: Pair) -> None:
    real, sim = (send_all(server.url) for server in both)
    for name, answer in sim.items():
        want = real[name]
        same_shape(name, real_status=want.status_code, real_body=want.text, answer=answer)


@pytest.fixture(scope="module")
def fronts(real: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("routers")
    with (
        router([real.url], tmp, name="router-a") as a,
        router([real.url], tmp, name="router-b") as b,
    ):
        yield a, b


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def an(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)


def _answer(response: Any) -> tuple[Any, ...]:
    # Not the cached-token counts: the second of two equal prompts hits the cache.
    usage = response.usage
    return (response.output_text, response.status, usage.input_tokens, usage.output_tokens)


def test_openai_responses_through_two_routers_are_vllms_own(
    real: Server, fronts: tuple[str, str]
) -> None:
    direct, a, b = oa(real.url), oa(fronts[0]), oa(fronts[1])
    request: dict[str, Any] = {
        "model": "tiny", "instructions": SYSTEM, "input": USER, "max_output_tokens": 4,
        "temperature": 0,
    }  # fmt: skip
    want = direct.responses.create(**request)
    made = a.responses.create(**request)
    assert _answer(made) == _answer(want)
    found = b.responses.retrieve(made.id)
    assert found.model_dump() == made.model_dump()
    follow = b.responses.create(
        model="tiny", input="And of grass?", previous_response_id=made.id,
        max_output_tokens=4, temperature=0,
    )  # fmt: skip
    direct_follow = direct.responses.create(
        model="tiny", input="And of grass?", previous_response_id=want.id,
        max_output_tokens=4, temperature=0,
    )  # fmt: skip
    assert _answer(follow) == _answer(direct_follow)
    with b.responses.stream(**request) as events:
        kinds = {e.type for e in events}
        assert events.get_final_response().output_text == want.output_text
    assert {"response.created", "response.output_text.delta", "response.completed"} <= kinds
    chat: dict[str, Any] = {
        "model": "tiny", "messages": [{"role": "user", "content": USER}], "max_tokens": 4,
        "temperature": 0,
    }  # fmt: skip
    assert (
        a.chat.completions.create(**chat).choices[0].message.content
        == direct.chat.completions.create(**chat).choices[0].message.content
    )


def test_anthropic_messages_through_the_router_are_vllms_own(
    real: Server, fronts: tuple[str, str]
) -> None:
    direct, routed = an(real.url), an(fronts[0])
    request: dict[str, Any] = {
        "model": "tiny", "system": SYSTEM, "messages": [{"role": "user", "content": USER}],
        "max_tokens": 4,
        # This anthropic SDK takes no temperature argument; vLLM reads it from the body.
        "extra_body": {"temperature": 0},
    }  # fmt: skip
    want, got = direct.messages.create(**request), routed.messages.create(**request)
    assert (got.content, got.stop_reason) == (want.content, want.stop_reason)
    assert (got.usage.input_tokens, got.usage.output_tokens) == (
        want.usage.input_tokens,
        want.usage.output_tokens,
    )
    with routed.messages.stream(**request) as stream:
        assert "".join(stream.text_stream) == want.content[0].text
    counted = routed.messages.count_tokens(
        model="tiny", system=SYSTEM, messages=request["messages"]
    )
    assert counted.input_tokens == want.usage.input_tokens


def test_a_router_answers_not_found_for_a_response_it_cannot_place(
    fronts: tuple[str, str],
) -> None:
    with pytest.raises(openai.NotFoundError):
        oa(fronts[0]).responses.retrieve("resp_" + "0" * 48)
