"""Continuous batching, admission, prefix hits and preemption, step by step."""

from __future__ import annotations

import itertools

from shoal.sim.kv_cache import BlockPool
from shoal.sim.scheduler import Scheduler, Sequence, Status

EOS = 1


def seq(name: str, prompt: list[int], max_tokens: int) -> Sequence:
    counter = itertools.count(100)
    return Sequence(
        request_id=name,
        token_ids=list(prompt),
        prompt_len=len(prompt),
        max_tokens=max_tokens,
        sample=lambda: next(counter),
        arrival=0.0,
    )


def run_step(s: Scheduler, now: float = 0.0) -> tuple[list[tuple[str, int]], list[str]]:
    plan = s.schedule(now)
    outcome = s.complete(plan, now, eos_token_id=EOS)
    return [(q.request_id, n) for q, n in plan.scheduled], [q.request_id for q in outcome.finished]


def test_max_num_seqs_caps_the_batch_and_the_rest_wait_in_order() -> None:
    s = Scheduler(
        pool=BlockPool(num_blocks=100, block_size=4), max_num_seqs=2, max_num_batched_tokens=100
    )
    for name in "abc":
        s.add(seq(name, [5, 6, 7], 2))
    scheduled, _ = run_step(s)
    assert [n for n, _ in scheduled] == ["a", "b"]
    assert [q.request_id for q in s.waiting] == ["c"]
    _, finished = run_step(s)
    assert finished == ["a", "b"]  # 2 tokens each: prefill sampled one, decode the other
    scheduled, _ = run_step(s)
    assert scheduled == [("c", 3)]


def test_token_budget_chunks_a_long_prefill_and_decodes_go_first() -> None:
    s = Scheduler(
        pool=BlockPool(num_blocks=100, block_size=4), max_num_seqs=8, max_num_batched_tokens=10
    )
    s.add(seq("short", [1, 2, 3], 5))
    s.add(seq("long", list(range(20, 45)), 5))
    assert run_step(s)[0] == [("short", 3), ("long", 7)]
    assert run_step(s)[0] == [("short", 1), ("long", 9)]
    assert run_step(s)[0] == [("short", 1), ("long", 9)]
    long = s.running[1]
    assert long.num_output == 1 and long.first_token is not None


def test_a_resent_prompt_hits_the_cache_in_whole_blocks_and_counts_once() -> None:
    s = Scheduler(
        pool=BlockPool(num_blocks=64, block_size=128), max_num_seqs=8, max_num_batched_tokens=2048
    )
    prompt = list(range(3, 603))
    s.add(seq("first", prompt, 1))
    plan = s.schedule(0.0)
    assert (plan.prefix_queries, plan.prefix_hits, plan.prompt_tokens) == (600, 0, 600)
    s.complete(plan, 0.0, eos_token_id=EOS)
    assert s.pool.usage() == 0.0  # finished: nothing held, blocks stay cached
    s.add(seq("again", prompt, 1))
    plan = s.schedule(1.0)
    assert (plan.prefix_queries, plan.prefix_hits) == (600, 512)
    assert plan.prompt_tokens == 88  # only the uncached tail is computed


def test_running_out_of_kv_preempts_the_newest_and_it_recomputes_later() -> None:
    # 9 usable blocks of 4 tokens; two sequences of 8 prompt + 12 output tokens
    # each need 5 blocks at the end, so both cannot finish side by side.
    s = Scheduler(
        pool=BlockPool(num_blocks=10, block_size=4), max_num_seqs=4, max_num_batched_tokens=64
    )
    a, b = seq("a", list(range(10, 18)), 12), seq("b", list(range(30, 38)), 12)
    s.add(a)
    s.add(b)
    preempted = []
    for step in range(40):
        plan = s.schedule(float(step))
        preempted += [q.request_id for q in plan.preempted]
        s.complete(plan, float(step), eos_token_id=EOS)
        if not s.has_work:
            break
    assert preempted and preempted[0] == "b"
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert a.status is b.status is Status.FINISHED
    assert a.num_output == b.num_output == 12
    # Recomputation kept the tokens already generated: the outputs run on.
    assert b.output_ids == list(range(100, 112))
    assert s.pool.usage() == 0.0


def test_a_preempted_request_goes_back_to_the_head_of_the_queue() -> None:
    s = Scheduler(
        pool=BlockPool(num_blocks=6, block_size=4), max_num_seqs=2, max_num_batched_tokens=64
    )
    s.add(seq("a", list(range(10, 18)), 20))
    s.add(seq("b", list(range(30, 37)), 20))
    s.add(seq("c", [40, 41], 1))
    for step in range(20):
        plan = s.schedule(float(step))
        if plan.preempted:
            assert [q.request_id for q in s.waiting][:2] == ["b", "c"]
            return
        s.complete(plan, float(step), eos_token_id=EOS)
    raise AssertionError("no preemption happened")


def test_end_of_sequence_finishes_with_stop() -> None:
    s = Scheduler(
        pool=BlockPool(num_blocks=10, block_size=4), max_num_seqs=2, max_num_batched_tokens=64
    )
    q = seq("a", [5, 6], 10)
    q.sample = lambda: None
    s.add(q)
    assert run_step(s)[1] == ["a"]
    assert q.finish_reason == "stop" and q.output_ids == [EOS]


def test_abort_frees_the_blocks() -> None:
    s = Scheduler(
        pool=BlockPool(num_blocks=10, block_size=4), max_num_seqs=2, max_num_batched_tokens=64
    )
    q = seq("a", list(range(5, 15)), 10)
    s.add(q)
    run_step(s)
    assert s.pool.usage() > 0
    s.abort(q)
    assert s.pool.usage() == 0.0 and not s.has_work
