"""`shoal warmup` as an operator of a fleet runs it, against real vLLM 0.32
(and the simulator beside it): a prompt file in, the engine's own prefix-cache
counters checked, a verdict printed and an exit code.

The tier's engines have 64 KV blocks of 128 tokens (8 MiB of KV for the tiny
model): a few prompts of ~550 tokens fit, two dozen do not. Runs after
test_against_vllm.py (file order) and sends the same requests to both servers,
so their HTTP series still agree.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sim_fixtures import parse_exposition, value
from tests.vllm.conftest import Server

SHOAL = Path(sys.executable).with_name("shoal")
BLOCK = 128
KV_BLOCKS = 64


def system_prompt(topic: str, rules: int = 15) -> str:
    """About 37 tokens per rule with the tiny model's tokenizer: 15 rules ~ 550 tokens."""
    head = f"You are the {topic} assistant of the shoal fleet. "
    return head + " ".join(
        f"rule {j}: answer briefly and cite the {topic} manual section {j}." for j in range(rules)
    )


@pytest.fixture(params=["real", "sim"])
def server(request: pytest.FixtureRequest) -> Server:
    found: Server = request.getfixturevalue(request.param)
    return found


def counters(server: Server) -> tuple[float, float]:
    """Successful requests and prefix-cache hit tokens, as the engine counts them."""
    samples = parse_exposition(httpx.get(f"{server.url}/metrics", timeout=30).text)[1]
    # max_tokens 1: every warm-up request finishes by length.
    return (
        value(samples, "vllm:request_success_total", finished_reason="length"),
        value(samples, "vllm:prefix_cache_hits_total"),
    )


def shoal_warmup(server: Server, prompts: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SHOAL), "warmup", "--endpoint", server.url, "--prompts", str(prompts), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )


def settled_requests(server: Server, want: float, timeout: float = 10.0) -> float:
    """vLLM's counters arrive a step late: wait for them to reach `want`."""
    deadline = time.monotonic() + timeout
    got = counters(server)[0]
    while got < want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = counters(server)[0]
    return got


def settled_hits(server: Server, want: float, timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    got = counters(server)[1]
    while got < want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = counters(server)[1]
    return got


def tokens(server: Server, prompt: str) -> int:
    """The prompt's length in the engine's own tokens."""
    answer = httpx.post(f"{server.url}/tokenize", json={"model": "tiny", "prompt": prompt})
    count: int = answer.json()["count"]
    return count


RESULT = re.compile(
    r"^(?P<verdict>\w+): (?P<sent>\d+) prompts sent in (?P<rounds>\d+) round\(s\), "
    r"hit ratio (?P<ratio>[\d.]+|n/a), (?P<seconds>[\d.]+)s"
)


def parse_result(stdout: str) -> dict[str, Any]:
    match = RESULT.match(stdout.strip())
    assert match, stdout
    return match.groupdict()


def test_a_plain_text_prompt_file_warms_the_engine(server: Server, tmp_path: Path) -> None:
    prompts = [system_prompt(f"plain-{server.name}-{i}") for i in range(5)]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n\n")  # a blank line is no prompt
    requests0, hits0 = counters(server)

    done = shoal_warmup(server, path)

    assert done.returncode == 0, done.stdout + done.stderr
    result = parse_result(done.stdout)
    assert result["verdict"] == "Warm"
    # One round: every prompt once, then each replayed (5 prompts <= the sample of 8).
    assert (result["sent"], result["rounds"]) == ("10", "1"), done.stdout
    assert float(result["ratio"]) >= 0.9
    # What the engine itself counted: 10 requests, and replays that hit every
    # whole block of their prompt but the last token's, floor((n - 1) / 128) * 128
    # (the first sends share no block: each prompt starts with its own topic).
    assert settled_requests(server, requests0 + 10) - requests0 == 10
    expected = [(tokens(server, p) - 1) // BLOCK * BLOCK for p in prompts]
    assert min(expected) >= BLOCK, expected
    assert settled_hits(server, hits0 + sum(expected)) - hits0 == sum(expected)


def test_a_jsonl_file_of_chat_messages_warms_the_engine(server: Server, tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = [
        {
            "messages": [
                {"role": "system", "content": system_prompt(f"chat-{server.name}-{i}")},
                {"role": "user", "content": "How do I scale the fleet?"},
            ]
        }
        for i in range(3)
    ]
    lines.append({"prompt": system_prompt(f"jsonl-{server.name}")})
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    requests0, _ = counters(server)

    done = shoal_warmup(server, path, "--model", "tiny", "--output", "json")

    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "Warm", result
    assert (result["promptsSent"], result["rounds"]) == (8, 1), result
    assert result["hitRatio"] >= 0.9
    assert settled_requests(server, requests0 + 8) - requests0 == 8


def test_a_prompt_set_larger_than_the_kv_cache_cannot_be_verified_warm(
    server: Server, tmp_path: Path
) -> None:
    # 24 prompts of ~5 blocks each need ~120 blocks; the engine has 64, so LRU
    # has evicted the earliest prompts by the time they are replayed.
    prompts = [system_prompt(f"overflow-{server.name}-{i}") for i in range(24)]
    assert len(prompts) * 4 > KV_BLOCKS
    path = tmp_path / "many.txt"
    path.write_text("\n".join(prompts) + "\n")

    done = shoal_warmup(server, path, "--timeout", "20")

    assert done.returncode == 1, done.stdout + done.stderr
    result = parse_result(done.stdout)
    assert result["verdict"] == "NotWarm", done.stdout
    assert int(result["rounds"]) >= 1 and int(result["sent"]) >= 24
    assert float(result["ratio"]) < 0.9
    assert "deadline of 20s passed" in done.stdout


def test_a_prompt_set_with_nothing_to_verify_exits_non_zero(server: Server, tmp_path: Path) -> None:
    # A prompt shorter than one block plus a token can never hit: nothing to verify.
    path = tmp_path / "short.txt"
    path.write_text("hello there\n")
    done = shoal_warmup(server, path, "--timeout", "20")
    assert done.returncode == 1, done.stdout + done.stderr
    assert parse_result(done.stdout)["verdict"] == "NothingToVerify"
    assert "no sampled prompt is longer than one 128-token block" in done.stdout
