"""Benchmark workloads: seeded and reproducible, with the sharing structure
each one promises, traces parsed strictly, and the ideal hit rate computed
as the engine counts hits."""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from shoal.bench.arrivals import arrival_offsets
from shoal.bench.ideal import PromptTokens, hit_rate_of, ideal_hit_rate
from shoal.bench.trace import TraceError, load_trace, parse_trace
from shoal.bench.workloads import synthetic
from shoal.sim.kv_cache import BlockPool, extend_block_hashes
from shoal.sim.profiles import PROFILES
from shoal.sim.tokenizer import render_chat

H100 = PROFILES["h100-llama3-8b"]


@pytest.mark.parametrize("name", ["shared-prefix", "long-tail", "random"])
def test_same_seed_same_requests_and_a_shorter_run_is_a_prefix(name: str) -> None:
    long = synthetic(name, count=60, seed=7)
    assert synthetic(name, count=60, seed=7).requests == long.requests
    assert synthetic(name, count=25, seed=7).requests == long.requests[:25]
    other = synthetic(name, count=60, seed=8)
    assert [r.messages for r in other.requests] != [r.messages for r in long.requests]


def test_shared_prefix_tenants_share_system_prompts_and_turns_resend_history() -> None:
    workload = synthetic("shared-prefix", count=400, seed=1, tenants=6, users_per_tenant=3)
    requests = workload.requests
    systems = {r.messages[0] for r in requests}
    assert all(role == "system" for role, _ in systems)
    assert len(systems) == 6, "one system prompt per tenant, shared by all its users"
    users_by_system: dict[tuple[str, str], set[str | None]] = {}
    for r in requests:
        users_by_system.setdefault(r.messages[0], set()).add(r.user)
    assert max(len(users) for users in users_by_system.values()) > 1
    by_index = {r.index: r for r in requests}
    followers = [r for r in requests if r.after is not None]
    assert len(followers) > len(requests) / 3, "most conversations go on for several turns"
    for r in followers:
        previous = by_index[r.after]  # type: ignore[index]
        assert previous.index < r.index and previous.user == r.user
        # The history is resent: the previous prompt, its answer, the new question.
        assert r.messages[: len(previous.messages)] == previous.messages
        assert [role for role, _ in r.messages[len(previous.messages) :]] == ["assistant", "user"]
        assert len(r.messages[len(previous.messages)][1].split()) == previous.max_tokens


def test_shared_prefix_tenant_popularity_is_skewed_and_user_field_optional() -> None:
    workload = synthetic("shared-prefix", count=2000, seed=2, tenants=20, tenant_skew=1.0)
    counts = Counter(r.messages[0] for r in workload.requests if r.after is None)
    ranked = counts.most_common()
    assert ranked[0][1] > 3 * ranked[-1][1], "a few tenants are much busier than the rest"
    quiet = synthetic("shared-prefix", count=50, seed=2, send_user=False)
    assert all(r.user is None for r in quiet.requests)
    assert "user" not in quiet.requests[0].body("m")


def test_long_tail_is_mostly_short_with_a_few_very_long() -> None:
    requests = synthetic("long-tail", count=2000, seed=3).requests
    groups = Counter(r.group for r in requests)
    assert 0.02 < groups["long"] / len(requests) < 0.07
    short = [r for r in requests if r.group == "short"]
    long = [r for r in requests if r.group == "long"]
    longest_short = max(len(r.messages[0][1].split()) for r in short)
    assert min(len(r.messages[0][1].split()) for r in long) > 5 * longest_short
    assert min(r.max_tokens for r in long) > max(r.max_tokens for r in short)
    assert synthetic("long-tail", count=10).groups == ("short", "long")


def test_random_prompts_share_nothing_and_body_is_a_streamed_chat() -> None:
    workload = synthetic("random", count=300, seed=4)
    assert ideal_hit_rate(workload.requests, profile=H100) == 0.0
    body = workload.requests[0].body("m")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == workload.requests[0].max_tokens and body["ignore_eos"] is True
    assert workload.requests[0].path == "/v1/chat/completions"


def test_prompt_tokens_match_the_simulators_own_tokenization() -> None:
    tokens = PromptTokens(H100)
    for request in synthetic("shared-prefix", count=40, seed=5).requests:
        chat: list[dict[str, object]] = [{"role": r, "content": c} for r, c in request.messages]
        assert tokens(request) == tokens.tokenizer.encode(render_chat(chat))


def test_ideal_hit_rate_counts_as_the_engines_prefix_cache_does() -> None:
    # Replay prompts through the simulator's own block pool, large enough
    # never to evict, and count its hits: the ideal must agree exactly.
    requests = synthetic("shared-prefix", count=150, seed=6, tenants=4).requests
    tokens = PromptTokens(H100)
    pool = BlockPool(num_blocks=200_000, block_size=H100.block_size)
    hits = queries = 0
    for request in requests:
        ids = tokens(request)
        hashes: list[bytes] = []
        extend_block_hashes(hashes, ids, H100.block_size)
        found = pool.lookup(hashes, num_tokens=len(ids))
        hits += len(found) * H100.block_size
        queries += len(ids)
        blocks = pool.allocate(len(hashes))
        assert blocks is not None
        pool.cache(blocks, hashes)
        pool.release(blocks)
    assert ideal_hit_rate(requests, profile=H100) == pytest.approx(hits / queries)
    assert 0.5 < hits / queries < 1.0


def test_hit_rate_never_covers_a_prompts_last_token() -> None:
    # Two identical 32-token prompts with blocks of 16: the second hits one
    # block, not two (the engine must compute the last token).
    prompt = list(range(32))
    assert hit_rate_of([prompt, prompt], block_size=16) == pytest.approx(16 / 64)
    assert hit_rate_of([prompt, [*prompt, 99]], block_size=16) == pytest.approx(32 / 65)


def test_trace_replays_in_timestamp_order_from_zero(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 105.5, "prompt": "second", "output_tokens": 4},
        {
            "timestamp": 100.0,
            "messages": [{"role": "user", "content": "first"}],
            "max_tokens": 8,
            "user": "u1",
            "group": "chat",
        },
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    workload = load_trace(path)
    first, second = workload.requests
    assert (first.at, second.at) == (0.0, 5.5)
    assert first.messages == (("user", "first"),) and first.max_tokens == 8
    assert first.user == "u1" and first.group == "chat"
    assert second.prompt == "second" and second.path == "/v1/completions"
    assert second.body("m")["prompt"] == "second"
    assert workload.groups == ("all", "chat")
    assert load_trace(path, count=1).requests == (first,)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "not JSON"),
        ('{"prompt": "x", "output_tokens": 1}', "timestamp"),
        ('{"timestamp": 0, "prompt": "x"}', "output_tokens"),
        ('{"timestamp": 0, "prompt": "x", "output_tokens": 0}', "output_tokens"),
        ('{"timestamp": 0, "output_tokens": 3}', "either"),
        ('{"timestamp": 0, "prompt": "x", "messages": [], "output_tokens": 3}', "either"),
        ('{"timestamp": 0, "messages": [{"role": "user"}], "output_tokens": 3}', "content"),
    ],
)
def test_trace_errors_name_the_line(line: str, problem: str) -> None:
    with pytest.raises(TraceError, match=f"line 2: .*{problem}"):
        parse_trace(['{"timestamp": 0, "prompt": "ok", "output_tokens": 1}', line])


def test_arrivals_are_seeded_at_the_asked_rate_and_bursty_when_asked() -> None:
    poisson = arrival_offsets(4000, rate=20.0, seed=1)
    assert poisson == arrival_offsets(4000, rate=20.0, seed=1)
    assert poisson[0] == 0.0 and poisson == sorted(poisson)
    assert 4000 / poisson[-1] == pytest.approx(20.0, rel=0.05)

    def gaps_cv(offsets: list[float]) -> float:
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    bursty = arrival_offsets(4000, rate=20.0, burstiness=0.25, seed=1)
    assert 4000 / bursty[-1] == pytest.approx(20.0, rel=0.1)
    assert gaps_cv(poisson) == pytest.approx(1.0, abs=0.1)
    assert gaps_cv(bursty) > 1.7, "bursty arrivals vary far more than Poisson ones"
    with pytest.raises(ValueError):
        arrival_offsets(3, rate=0)
