"""Warm-up arithmetic and prompt sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.warmup.prompts import Prompt, combine, load_file, parse_lines
from shoal.warmup.verify import expected_hits, hit_ratio, replay_sample


@pytest.mark.parametrize(
    ("tokens", "block", "hits"),
    [
        (600, 128, 512),  # the fixtures: a 600-token prompt sent twice hit 512 tokens
        (512, 128, 384),  # the last token is never a hit, so the 4th block is not either
        (513, 128, 512),
        (128, 128, 0),
        (129, 128, 128),
        (17, 16, 16),
        (16, 16, 0),
        (1, 16, 0),
        (0, 16, 0),
    ],
)
def test_expected_hits_are_whole_blocks_short_of_the_last_token(
    tokens: int, block: int, hits: int
) -> None:
    assert expected_hits(tokens, block) == hits


def test_replay_sample_always_includes_the_earliest_prompts() -> None:
    assert replay_sample(5, size=8) == [0, 1, 2, 3, 4]
    sample = replay_sample(100, size=8)
    assert sample[:4] == [0, 1, 2, 3] and len(sample) == 8 and max(sample) > 50


def test_hit_ratio() -> None:
    assert hit_ratio(512 + 384, [512, 384]) == 1.0
    assert hit_ratio(448, [512, 384]) == 0.5
    assert hit_ratio(10, [0, 0]) is None


def test_prompt_files_plain_and_jsonl(tmp_path: Path) -> None:
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    assert load_file(plain) == [Prompt(text="first prompt"), Prompt(text="second prompt")]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"messages": [{"role": "system", "content": "S"}]}\n')
    loaded = load_file(jsonl)
    assert loaded[0] == Prompt(text="a")
    assert loaded[1].request("m") == (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "system", "content": "S"}], "max_tokens": 1},
    )
    with pytest.raises(ValueError, match="line 2"):
        parse_lines('{"prompt": "a"}\n{"nope": 1}\n', jsonl=True)


def test_sources_combine_in_order_without_duplicates_and_bounded() -> None:
    inline = [Prompt(text="a"), Prompt(text="b")]
    configmap = [Prompt(text="b"), Prompt(text="c"), Prompt(text="")]
    hot = [Prompt(text="d"), Prompt(text="e")]
    assert combine([inline, configmap, hot], max_prompts=4) == [Prompt(text=t) for t in "abcd"]
    huge = combine([[Prompt(text="x" * 100_000)]], max_prompts=1)
    assert huge[0].size == 64 * 1024
