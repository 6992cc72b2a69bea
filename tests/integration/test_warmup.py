"""Warm-up against simulated engines: verified from the engine's own hit
counters, and a prompt set the cache cannot hold never passes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from shoal.controller.warming import hot_prefix_prompts
from shoal.engine.client import EngineClient
from shoal.engine.errors import Unreachable
from shoal.engine.metrics import parse
from shoal.warmup.prompts import Prompt
from shoal.warmup.runner import WarmupResult, warm
from shoal.warmup.verify import Verdict
from tests.integration.procs import MODEL, engine_metric, free_port, router, set_fault, sims

SYSTEM = "You are the assistant of the shoal fleet; answer from the manual. "


async def warmed(endpoint: str, prompts: list[Prompt], **options: Any) -> WarmupResult:
    """A warm-up over a client of its own, as `shoal warmup` runs one."""
    async with EngineClient() as engine:
        return await warm(endpoint, prompts, engine=engine, **options)


def _prompts(count: int, words: int) -> list[Prompt]:
    return [Prompt(text=f"tenant {i}: " + (SYSTEM * words)) for i in range(count)]


def test_a_cold_engine_is_warmed_and_verified(tmp_path: Path) -> None:
    with sims(1, tmp_path) as urls:
        assert engine_metric(urls[0], "vllm:prefix_cache_hits_total") == 0
        result = asyncio.run(warmed(urls[0], _prompts(6, 8), min_hit_ratio=0.9, timeout_seconds=30))
        assert result.verdict is Verdict.WARM, result.message
        assert result.hit_ratio is not None and result.hit_ratio >= 0.9
        assert result.prompts_sent >= 6
        assert engine_metric(urls[0], "vllm:prefix_cache_hits_total") > 0


def test_an_engine_briefly_unreachable_is_warmed_once_it_answers(tmp_path: Path) -> None:
    # One connection error gave the verdict Unreachable at once, and the
    # operator admitted the cold engine (seen in the e2e tier: a stopping
    # process at the address of the pod that replaced it).
    with sims(1, tmp_path) as urls:
        set_fault(urls[0], refuse_seconds=1.5)
        result = asyncio.run(warmed(urls[0], _prompts(6, 8), min_hit_ratio=0.9, timeout_seconds=30))
        assert result.verdict is Verdict.WARM, result.message
    # Never answering: Unreachable at the deadline, saying why.
    result = asyncio.run(warmed("http://127.0.0.1:9", _prompts(2, 8), timeout_seconds=2))
    assert result.verdict is Verdict.UNREACHABLE, result.message
    assert "deadline of 2s passed; the engine last failed" in result.message, result.message


class _BlipOnce(EngineClient):
    """A client whose completion number `at` fails once, as a blip would."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            raise Unreachable("reset by peer (a blip)")
        return await super().complete(*args, **kwargs)


def test_a_blip_during_the_replay_is_retried_not_the_end_of_the_warm_up(tmp_path: Path) -> None:
    """One failing call in the replay (after the round's 6 sends) ended the
    warm-up Unreachable: a cold engine admitted under Admit, held for good
    under Hold."""

    async def run(url: str) -> WarmupResult:
        async with _BlipOnce(at=7) as engine:
            return await warm(url, _prompts(6, 8), engine=engine, timeout_seconds=30)

    with sims(1, tmp_path) as urls:
        result = asyncio.run(run(urls[0]))
    assert result.verdict is Verdict.WARM, result.message


def test_a_prompt_the_engine_refuses_is_skipped_not_the_warm_up(tmp_path: Path) -> None:
    """A prompt longer than max_model_len gets vLLM's 400; the others still
    warm the engine, and the result says what was refused."""
    too_long = Prompt(text="word " * 3000)
    with sims(1, tmp_path, extra=["--max-model-len", "1024"]) as urls:
        result = asyncio.run(
            warmed(urls[0], [too_long, *_prompts(4, 8)], min_hit_ratio=0.9, timeout_seconds=30)
        )
        assert result.verdict is Verdict.WARM, result.message
        assert "1 prompt(s) refused by the engine" in result.message
        assert "400" in result.message
        alone = asyncio.run(warmed(urls[0], [too_long], timeout_seconds=30))
        assert alone.verdict is Verdict.NOTHING_TO_VERIFY, alone.message
        assert alone.prompts_sent == 0 and "refused" in alone.message


def test_a_set_larger_than_the_cache_ends_by_timeout(tmp_path: Path) -> None:
    # 40 blocks of 16 tokens: far less than 30 prompts of a hundred tokens or more.
    small = ["--num-gpu-blocks-override", "40", "--block-size", "16", "--max-model-len", "512"]
    with sims(1, tmp_path, extra=small) as urls:
        result = asyncio.run(
            warmed(urls[0], _prompts(30, 6), min_hit_ratio=0.9, timeout_seconds=4, sample_size=8)
        )
        assert result.verdict in (Verdict.NOT_WARM, Verdict.TIMEOUT), result.message
        assert result.rounds >= 1
        if result.hit_ratio is not None:
            assert result.hit_ratio < 0.9


def test_shoal_warmup_command(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "system", "content": SYSTEM * 8},
                        {"role": "user", "content": f"question {i}"},
                    ]
                }
            )
            for i in range(4)
        )
    )
    with sims(1, tmp_path) as urls:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "warmup",
                "--endpoint",
                urls[0],
                "--prompts",
                str(prompts),
                "--model",
                MODEL,
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["verdict"] == "Warm" and report["promptsSent"] >= 4
        unreachable = subprocess.run(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "warmup",
                "--endpoint",
                "http://127.0.0.1:9",
                "--prompts",
                str(prompts),
                "--timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert unreachable.returncode == 1
        assert "Unreachable" in unreachable.stdout


def test_chat_hot_prefixes_warm_what_chat_requests_hit(tmp_path: Path) -> None:
    """Chat traffic through a router makes its shared system message hot, as
    messages; warmed from the router's list as the operator warms, a fresh
    engine then hits that system message's blocks for a new conversation
    (the engine renders chat through its template, so the router's rendered
    text of a chat request would have warmed blocks no chat request hits)."""
    system = SYSTEM * 12

    def chat(question: str) -> dict[str, object]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return {"model": MODEL, "messages": messages, "max_tokens": 1}

    internal = free_port()
    config = {"hotPrefixes": {"enabled": True}, "internalPort": internal}
    with sims(2, tmp_path) as (serving, fresh), router([serving], tmp_path, config=config) as front:
        for i in range(4):
            answer = httpx.post(front + "/v1/chat/completions", json=chat(f"Q{i}?"), timeout=30)
            assert answer.status_code == 200, answer.text
        hot = httpx.get(f"http://127.0.0.1:{internal}/hot-prefixes", timeout=5).json()
        assert hot["prefixes"] == [
            {"messages": [{"role": "system", "content": system}], "count": 4}
        ]
        prompts = hot_prefix_prompts(hot)  # what the operator reads, then warms with
        assert prompts == [Prompt(messages=(("system", system),))]

        result = asyncio.run(warmed(fresh, prompts, min_hit_ratio=0.9, timeout_seconds=30))
        assert result.verdict is Verdict.WARM, result.message

        block = parse(httpx.get(fresh + "/metrics", timeout=5).text).block_size
        tokenized = httpx.post(fresh + "/tokenize", json={"model": MODEL, "prompt": system})
        system_blocks = len(tokenized.json()["tokens"]) // (block or 0)
        assert system_blocks >= 8
        before = engine_metric(fresh, "vllm:prefix_cache_hits_total")
        answer = httpx.post(fresh + "/v1/chat/completions", json=chat("A new one?"), timeout=30)
        assert answer.status_code == 200, answer.text
        hits = engine_metric(fresh, "vllm:prefix_cache_hits_total") - before
        assert hits >= system_blocks * (block or 0), (hits, system_blocks, block)
