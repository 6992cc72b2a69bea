"""How the load driver reads a streamed answer:

- real vLLM 0.32 streams whose chunks carry empty text (`"text":""`,
  `"delta":{"content":""}`) still give a time to first token and count as
  answered, as `vllm bench serve` counts them;
- the usage chunk gives the token counts;
- an answer without `[DONE]` ended early.
"""

from __future__ import annotations

import pytest

from shoal.bench.driver import Outcome, _Stream
from tests.sim_fixtures import text


def _read(raw: str, *, upto: int | None = None) -> Outcome:
    outcome = Outcome(index=0, group="all")
    stream = _Stream(outcome, started=0.0, scale=1.0)
    lines = raw.splitlines(keepends=True)[:upto]
    for i, line in enumerate(lines):
        stream.feed(line.encode(), now=0.5 + i)
    stream.finish(now=100.0)
    return outcome


@pytest.mark.parametrize(
    ("fixture", "prompt_tokens"), [("completion.stream.txt", 3), ("chat.stream.txt", 35)]
)
def test_a_real_vllm_stream_of_empty_texts_gives_a_ttft_and_no_error(
    fixture: str, prompt_tokens: int
) -> None:
    outcome = _read(text(fixture))
    assert outcome.error is None
    assert outcome.ok
    assert outcome.ttft == 0.5
    assert outcome.prompt_tokens == prompt_tokens
    assert outcome.output_tokens == 4
    assert outcome.latency == 100.0


def test_a_stream_cut_before_done_ended_early() -> None:
    outcome = _read(text("completion.stream.txt"), upto=4)
    assert not outcome.ok
    assert outcome.error == "the stream ended early"
