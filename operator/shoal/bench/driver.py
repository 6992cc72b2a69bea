"""The load driver: sends a workload's requests to an OpenAI-compatible URL,
streamed, and times every token as it arrives.

Three ways to pace it:

- open loop (`OpenLoop`): requests leave at their arrival times whatever the
  server's state (Poisson or bursty), as users do; overload shows as growing
  latency, not as a lower offered rate;
- closed loop (`ClosedLoop`): a fixed number of clients, each sending its next
  request when its last one ends (what a batch job does);
- replay (`Replay`): at a trace's own timestamps.

A conversation's next turn is never sent before the previous turn's answer
has ended (a person reads before typing); it is sent then, or at its own
arrival time if that is later. The run is bounded: every request has a
deadline, and the whole run a deadline after which what is left is cancelled
and counted as failed.

Times are measured in wall seconds and reported in the engine's seconds:
against simulators running `time_scale` times faster than real time, both
the arrival times and the measured durations are scaled.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from shoal.bench.arrivals import arrival_offsets
from shoal.bench.workloads import BenchRequest

# The router names the replica that answered in this response header.
REPLICA_HEADER = "x-shoal-replica"


@dataclass(frozen=True)
class OpenLoop:
    rate: float  # requests per second
    burstiness: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int


@dataclass(frozen=True)
class Replay:
    speed: float = 1.0  # 2.0 replays twice as fast


Pacing = OpenLoop | ClosedLoop | Replay


@dataclass
class Outcome:
    index: int
    group: str
    sent: float = 0.0  # seconds from the start of the run
    ok: bool = False
    error: str | None = None
    ttft: float | None = None  # seconds to the first chunk of output (even empty text)
    itls: list[float] = field(default_factory=list)  # gaps between later chunks
    latency: float | None = None  # end to end, for completed requests
    prompt_tokens: int = 0
    output_tokens: int = 0
    replica: str | None = None


@dataclass
class Run:
    outcomes: list[Outcome]
    duration: float  # first send to last answer, engine seconds


class _Stream:
    """Parses one streamed answer (server-sent events) as it arrives."""

    def __init__(self, outcome: Outcome, started: float, scale: float) -> None:
        self.outcome = outcome
        self.started = started
        self.scale = scale
        self.last: float | None = None
        self.chunks = 0
        self.done = False

    def feed(self, line: bytes, now: float) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise _StreamError(f"error in stream: {message}")
        # A chunk with a choice is output even when its text is empty (a
        # special token, or a tokenizer that decodes to nothing, as on the
        # fixtures' tiny model); `vllm bench serve` times it the same way.
        # The closing usage chunk has no choice.
        if chunk.get("choices"):
            self.chunks += 1
            if self.last is None:
                self.outcome.ttft = (now - self.started) * self.scale
            else:
                self.outcome.itls.append((now - self.last) * self.scale)
            self.last = now
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.outcome.output_tokens = int(usage.get("completion_tokens") or 0)

    def finish(self, now: float) -> None:
        """Judge the answer once its body has ended."""
        if not self.done or self.outcome.ttft is None:
            self.outcome.error = "the stream ended early"
            return
        self.outcome.ok = True
        self.outcome.latency = (now - self.started) * self.scale
        if not self.outcome.output_tokens:
            self.outcome.output_tokens = self.chunks


class _StreamError(Exception):
    pass


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    request: BenchRequest,
    *,
    model: str,
    outcome: Outcome,
    limit_seconds: float,
    scale: float,
) -> None:
    started = time.perf_counter()
    stream = _Stream(outcome, started, scale)
    try:
        async with session.post(
            url + request.path,
            json=request.body(model),
            timeout=aiohttp.ClientTimeout(total=limit_seconds),
        ) as response:
            outcome.replica = response.headers.get(REPLICA_HEADER)
            if response.status != 200:
                text = (await response.text())[:300]
                outcome.error = f"HTTP {response.status}: {text}"
                return
            async for line in response.content:
                stream.feed(line, time.perf_counter())
    except (aiohttp.ClientError, TimeoutError, _StreamError, ValueError) as error:
        outcome.error = str(error) or type(error).__name__
        return
    stream.finish(time.perf_counter())


async def drive(
    url: str | Sequence[str],
    requests: Sequence[BenchRequest],
    *,
    model: str,
    pacing: Pacing,
    time_scale: float = 1.0,
    request_timeout: float = 300.0,
    run_timeout: float = 3600.0,
    max_concurrency: int | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Run:
    """Send every request (bounded in time), return what each one did.

    `time_scale` is how many engine seconds pass per wall second (a
    simulator's --sim-time-scale); rates and timestamps are in engine time.

    Several URLs stand for router replicas behind a Service without session
    affinity: each request goes to one of them at random (seeded by the
    pacing's seed, so every policy sees the same split)."""
    urls = [u.rstrip("/") for u in ([url] if isinstance(url, str) else url)]
    split = random.Random(f"{getattr(pacing, 'seed', 0)}-routers")
    targets = [urls[0] if len(urls) == 1 else split.choice(urls) for _ in requests]
    outcomes = [Outcome(index=r.index, group=r.group) for r in requests]
    position = {r.index: i for i, r in enumerate(requests)}
    answered = {r.after: asyncio.Event() for r in requests if r.after is not None}
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    connector = aiohttp.TCPConnector(limit=0)
    start = time.perf_counter()
    ends: list[float] = []

    async def one(request: BenchRequest) -> None:
        outcome = outcomes[position[request.index]]
        target = targets[position[request.index]]
        try:
            if request.after is not None and request.after in position:
                await answered[request.after].wait()
            if limit is not None:
                await limit.acquire()
            try:
                outcome.sent = (time.perf_counter() - start) * time_scale
                await _send(
                    session,
                    target,
                    request,
                    model=model,
                    outcome=outcome,
                    limit_seconds=request_timeout / time_scale,
                    scale=time_scale,
                )
            finally:
                if limit is not None:
                    limit.release()
        finally:
            ends.append(time.perf_counter())
            if not outcome.ok and outcome.error is None:
                outcome.error = "cancelled at the run's deadline"
            if request.index in answered:
                answered[request.index].set()
            if on_outcome is not None:
                on_outcome(outcome)

    async def at(offset: float, request: BenchRequest) -> None:
        await asyncio.sleep(max(0.0, start + offset / time_scale - time.perf_counter()))
        await one(request)

    async def closed(queue: asyncio.Queue[BenchRequest]) -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    async with aiohttp.ClientSession(connector=connector) as session:
        if isinstance(pacing, ClosedLoop):
            queue: asyncio.Queue[BenchRequest] = asyncio.Queue()
            for request in requests:
                queue.put_nowait(request)
            jobs = [closed(queue) for _ in range(max(1, pacing.concurrency))]
        else:
            if isinstance(pacing, OpenLoop):
                offsets = arrival_offsets(
                    len(requests), rate=pacing.rate, burstiness=pacing.burstiness, seed=pacing.seed
                )
            else:
                offsets = [(r.at or 0.0) / pacing.speed for r in requests]
            jobs = [at(offset, r) for offset, r in zip(offsets, requests, strict=True)]
        tasks = [asyncio.ensure_future(job) for job in jobs]
        _, pending = await asyncio.wait(tasks, timeout=run_timeout / time_scale)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for outcome in outcomes:
        if not outcome.ok and outcome.error is None:
            outcome.error = "not answered before the run's deadline"
    duration = (max(ends, default=start) - start) * time_scale
    return Run(outcomes=outcomes, duration=duration)
