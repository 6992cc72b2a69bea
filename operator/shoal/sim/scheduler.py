"""Continuous batching, as vLLM v1's scheduler does it, without the model.

One `schedule()` per engine step: running sequences first, in order, each
taking the tokens it still needs (a whole prompt chunk, or 1 to decode) from
the step's token budget; when the KV pool cannot hold a running sequence's
next tokens, the last running sequence is preempted (its blocks released, its
progress dropped, to be recomputed) and put at the head of the waiting queue.
Then, if nothing was preempted, waiting sequences are admitted in order while
a sequence slot, budget and KV blocks for the whole sequence are free (vLLM's
`scheduler_reserve_full_isl`), after a prefix-cache lookup. `complete()` then
applies the step: KV computed, full blocks cached, one token sampled per
sequence whose tokens are all computed. The time a step takes is not decided
here (see `engine.py`); `now` only stamps the request's timeline.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.sim.kv_cache import BlockHash, BlockPool, extend_block_hashes


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class ParentRequest:
    """The n > 1 choices of one prompt (vLLM's ParentRequest): some stats are
    per request, recorded once the last choice ends."""

    n: int
    max_output: int = 0  # the most tokens a finished choice generated
    finished: int = 0

    def finish_choice(self, num_output: int) -> bool:
        """Note a choice's end; True when it was the last one."""
        self.max_output = max(self.max_output, num_output)
        self.finished += 1
        return self.finished == self.n


@dataclass(eq=False, kw_only=True)
class Sequence:
    request_id: str
    token_ids: list[int]  # the prompt, then every sampled token
    prompt_len: int
    max_tokens: int
    # Returns the next token to sample, or None for end of sequence.
    sample: Callable[[], int | None]
    arrival: float  # at the API server: where vLLM's TTFT starts
    parent: ParentRequest | None = None  # None for a request of one choice
    # When the frontend handed it to the scheduler: where vLLM's queue time
    # starts (None while the frontend still has it).
    queued: float | None = None
    status: Status = Status.WAITING
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_computed: int = 0
    num_cached_blocks: int = 0  # blocks already registered in the prefix cache
    num_cached_prompt_tokens: int = 0  # the first lookup's hit
    num_preemptions: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]


@dataclass
class StepPlan:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    prompt_tokens: int = 0  # tokens prefilled or recomputed this step
    decode_seqs: int = 0
    decode_context_tokens: int = 0  # the context the decoding sequences attend to
    preempted: list[Sequence] = field(default_factory=list)
    # Prefix-cache lookups of first admissions (preempted ones are not
    # counted, as in vLLM's PrefixCacheStats; none without prefix caching), in tokens.
    prefix_queries: int = 0
    prefix_hits: int = 0

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass
class StepOutcome:
    sampled: list[Sequence] = field(default_factory=list)  # got one new token
    finished: list[Sequence] = field(default_factory=list)
    prefills_done: list[Sequence] = field(default_factory=list)  # first token, first time


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(self, *, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.pool.block_size)
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:  # else not queued yet
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or "abort"

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        block_size = self.pool.block_size
        scheduled: dict[Sequence, int] = {}

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            need = _cdiv(seq.num_computed + n, block_size) - len(seq.blocks)
            while need > self.pool.num_free:
                victim = self.running.pop()
                budget += scheduled.pop(victim, 0)
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break
            new_blocks = self.pool.allocate(need)
            assert new_blocks is not None
            seq.blocks.extend(new_blocks)
            scheduled[seq] = n
            budget -= n
            i += 1

        while (
            not plan.preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            hit = self.pool.lookup(seq.block_hashes, num_tokens=seq.num_tokens)
            full = _cdiv(seq.num_tokens, block_size)
            if self.pool.num_needed(hit, num_blocks=full) > self.pool.num_free:
                break
            self.waiting.popleft()
            self.pool.take(hit)
            seq.blocks = list(hit)
            seq.num_computed = seq.num_cached_blocks = len(hit) * block_size
            seq.num_cached_blocks = len(hit)
            n = min(seq.num_tokens - seq.num_computed, budget)
            new_blocks = self.pool.allocate(_cdiv(seq.num_computed + n, block_size) - len(hit))
            assert new_blocks is not None
            seq.blocks.extend(new_blocks)
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = seq.num_computed
                seq.first_scheduled = now
                if self.pool.enable_caching:  # no lookup, no stats (as vLLM's)
                    plan.prefix_queries += seq.num_tokens
                    plan.prefix_hits += seq.num_computed
            seq.status = Status.RUNNING
            self.running.append(seq)
            scheduled[seq] = n
            budget -= n

        for seq, n in scheduled.items():
            plan.scheduled.append((seq, n))
            if n == 1 and seq.num_output > 0 and seq.num_computed == seq.num_tokens - 1:
                plan.decode_seqs += 1
                plan.decode_context_tokens += seq.num_computed
            else:
                plan.prompt_tokens += n
        return plan

    def complete(self, plan: StepPlan, now: float, *, eos_token_id: int) -> StepOutcome:
        outcome = StepOutcome()
        block_size = self.pool.block_size
        for seq, n in plan.scheduled:
            if seq.status is not Status.RUNNING:  # aborted during the step
                continue
            seq.num_computed += n
            full = seq.num_computed // block_size
            if full > seq.num_cached_blocks:
                extend_block_hashes(seq.block_hashes, seq.token_ids, block_size)
                self.pool.cache(
                    seq.blocks[seq.num_cached_blocks : full],
                    seq.block_hashes[seq.num_cached_blocks : full],
                )
                seq.num_cached_blocks = full
            if seq.num_computed < seq.num_tokens:
                continue  # a prompt chunk; more to prefill
            token = seq.sample()
            seq.token_ids.append(eos_token_id if token is None else token)
            if seq.first_token is None:
                seq.first_token = now
                outcome.prefills_done.append(seq)
            seq.last_token = now
            outcome.sampled.append(seq)
            if token is None:
                seq.finish_reason = "stop"
            elif seq.num_output >= seq.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                self.running.remove(seq)
                self._release(seq)
                seq.status = Status.FINISHED
                outcome.finished.append(seq)
        return outcome

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_cached_blocks = 0
