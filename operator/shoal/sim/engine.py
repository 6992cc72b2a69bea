"""The engine loop: steps the scheduler in (scaled) time and feeds streams.

One asyncio task per engine, asleep while there is no work, so idle engines
cost nothing and many share one event loop. A step lasts what the profile's
step-time model says (times the slowness fault, over the time scale); its
tokens appear when it ends. Steps are laid back to back on a deadline, so the
Python time spent between them does not add up to drift. Timestamps, and so
every latency in /metrics, are in simulated seconds (wall time x time scale),
what the simulated engine would have measured.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from array import array
from collections.abc import AsyncIterator, Callable

from shoal.sim.config import EngineConfig
from shoal.sim.faults import Faults
from shoal.sim.kv_cache import BlockPool
from shoal.sim.metrics import EngineMetrics
from shoal.sim.scheduler import ParentRequest, Scheduler, Sequence, Status
from shoal.sim.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class EngineDeadError(Exception):
    """The engine died (a crash fault); vLLM answers 500 with this message."""

    MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class RequestStream:
    """A submitted request's tokens as they are generated."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        self._engine = engine
        self.seq = seq
        self._ready = asyncio.Event()
        self._delivered = 0
        self.dead = False

    def notify(self) -> None:
        self._ready.set()

    async def deltas(self) -> AsyncIterator[list[int]]:
        """Yields the tokens generated since the last yield; a consumer that
        falls behind gets several at once, as vLLM merges undelivered outputs."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.dead:
                raise EngineDeadError(EngineDeadError.MESSAGE)
            # Read the status with the tokens: it may change while we are suspended.
            finished = self.seq.status is Status.FINISHED
            tokens = self.seq.token_ids[self.seq.prompt_len + self._delivered :]
            self._delivered += len(tokens)
            if tokens:
                yield tokens
            if finished:
                return

    def abort(self) -> None:
        self._engine.abort(self)


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.faults: Faults = config.faults
        profile = config.profile
        self.tokenizer = Tokenizer(vocab_size=profile.vocab_size, bos_token_id=profile.bos_token_id)
        self.pool = BlockPool(
            num_blocks=config.resolved_num_gpu_blocks,
            block_size=config.resolved_block_size,
            enable_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            pool=self.pool,
            max_num_seqs=config.resolved_max_num_seqs,
            max_num_batched_tokens=config.resolved_max_num_batched_tokens,
        )
        self.metrics = EngineMetrics(
            model_name=config.names[0],
            max_model_len=config.resolved_max_model_len,
            cache=config.cache_info(),
        )
        self.error_rng = random.Random(config.seed)
        self.dead = False
        self.steps = 0
        self._streams: dict[Sequence, RequestStream] = {}
        self._wake = asyncio.Event()
        self._unhung = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._next_id = 0

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        self._task = loop.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def die(self) -> None:
        """The engine core dies: every request fails, nothing steps again."""
        self.dead = True
        if self._task is not None:
            self._task.cancel()
        for stream in self._streams.values():
            stream.dead = True
            stream.notify()
        self._streams.clear()

    def set_hang(self, hang: bool) -> None:
        self.faults.hang = hang
        if not hang:
            self._unhung.set()

    def now(self) -> float:
        """Simulated seconds since start."""
        return (asyncio.get_running_loop().time() - self._t0) * self.config.time_scale

    # -- requests --------------------------------------------------------------

    def submit(
        self,
        *,
        prompt_ids: list[int],
        max_tokens: int,
        seed: int | None,
        ignore_eos: bool,
        choice: int = 0,
        parent: ParentRequest | None = None,
    ) -> RequestStream:
        if self.dead:
            raise EngineDeadError(EngineDeadError.MESSAGE)
        self._next_id += 1
        seq = Sequence(
            request_id=str(self._next_id),
            token_ids=list(prompt_ids),
            prompt_len=len(prompt_ids),
            max_tokens=max_tokens,
            sample=self._sampler(prompt_ids, seed, ignore_eos, choice),
            arrival=self.now(),
            parent=parent,
        )
        stream = RequestStream(self, seq)
        self._streams[seq] = stream
        delay = self.config.profile.frontend_s / self.config.time_scale
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._enqueue, stream)
        else:
            # No frontend: it reaches the scheduler as it arrives. (A second
            # reading of the clock would put microseconds between the two.)
            self._enqueue(stream, at=seq.arrival)
        return stream

    def _enqueue(self, stream: RequestStream, at: float | None = None) -> None:
        if stream.seq.status is Status.FINISHED or self.dead:
            return  # aborted, or the engine died, before the frontend handed it over
        stream.seq.queued = self.now() if at is None else at
        self.scheduler.add(stream.seq)
        self._publish_state()
        self._wake.set()

    def abort(self, stream: RequestStream) -> None:
        seq = stream.seq
        if self._streams.pop(seq, None) is None or seq.status is Status.FINISHED:
            return
        self.scheduler.abort(seq)
        self._publish_state()

    def _sampler(
        self, prompt_ids: list[int], seed: int | None, ignore_eos: bool, choice: int
    ) -> Callable[[], int | None]:
        """Deterministic output: a function of the seed, the prompt and the
        choice index (n > 1) only, not of batching, timing or preemption."""
        material = hashlib.blake2b(
            array("q", [self.config.seed if seed is None else seed, choice]).tobytes()
            + array("I", prompt_ids).tobytes(),
            digest_size=8,
        ).digest()
        rng = random.Random(int.from_bytes(material, "little"))
        words = self.tokenizer.word_ids()
        stop_p = 0.0 if ignore_eos else self.config.stop_probability

        def sample() -> int | None:
            if stop_p and rng.random() < stop_p:
                return None
            return words[rng.randrange(len(words))]

        return sample

    # -- the loop --------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.config.time_scale
        profile = self.config.profile
        deadline: float | None = None  # when the previous step ended, if busy
        while True:
            if self.faults.hang:
                await self._hung()
                deadline = None
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                deadline = None
                continue
            plan = self.scheduler.schedule(self.now())
            self._publish_state()
            if plan.empty:  # nothing fits until a request leaves
                self._wake.clear()
                await self._wake.wait()
                deadline = None
                continue
            seconds = profile.step_seconds(
                prompt_tokens=plan.prompt_tokens,
                decode_seqs=plan.decode_seqs,
                decode_context_tokens=plan.decode_context_tokens,
            )
            start = loop.time() if deadline is None else max(deadline, loop.time() - 0.05)
            deadline = start + seconds * self.faults.slowness / scale
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if self.faults.hang:
                await self._hung()  # the step ends only once the hang does
            now = self.now()
            previous = {seq: seq.last_token for seq, _ in plan.scheduled}
            outcome = self.scheduler.complete(
                plan, now, eos_token_id=self.config.profile.eos_token_id
            )
            self.steps += 1
            itls = [
                now - last for seq in outcome.sampled if (last := previous.get(seq)) is not None
            ]
            self.metrics.record_step(plan, outcome, now=now, itls=itls)
            self._publish_state()
            for seq in outcome.sampled:
                stream = self._streams.get(seq)
                if stream is not None:
                    stream.notify()
            for seq in outcome.finished:
                self._streams.pop(seq, None)

    async def _hung(self) -> None:
        while self.faults.hang:
            self._unhung.clear()
            await self._unhung.wait()

    def _publish_state(self) -> None:
        # vLLM's gauges come from its engine core's steps: a hung engine's freeze.
        if self.faults.hang:
            return
        self.metrics.record_state(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_usage=self.pool.usage(),
        )
