"""Placements shared between one cluster's router replicas.

Each router learns its prefix index from its own routing decisions. Behind a
Service that splits requests at random, a conversation's next turn often
reaches another router, which then knows only the tenant's shared prompt and
not where the conversation's history is cached (with two routers, 3.7 points
of hits were lost: docs/benchmarks.md). So each router keeps a bounded log of
its own placements (the replica, the prompt's checkpoint hashes) and its
peers long-poll it on the internal port, recording what they read in their
own index as if they had routed it. Each answer also carries the prompt
tokens the peer has sent each replica that are not prefilled yet (its own
queue estimate, which moves at once where scraped queues lag a scrape), so
every router weighs the prefill the others queued too.

Best effort: a peer that is down or slow costs hits, never a request, and
nothing is on the request path but an append. A router shares only its own
decisions, never what it learned, so nothing circulates. A router that
starts (a rollout, a new replica) reads what its peers still hold and starts
with their view of the caches instead of a cold one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from shoal.router.reads import loads, read_whole

log = logging.getLogger("shoal.router.placements")

PLACEMENTS_PATH = "/placements"
# Placements a router keeps for its peers: at 1,000 requests a second a peer
# that is 4 s behind still reads all it missed.
LOG_CAPACITY = 4096
# Placements in one answer, so one answer stays under a few hundred KiB.
MAX_PER_READ = 512
# How long a read waits for a placement when none is new (long poll).
WAIT_SECONDS = 5.0
RETRY_SECONDS = (0.5, 10.0)
# Least time between two reads of one peer: every prefill done wakes a reader,
# and at thousands of requests a second answers would cost the routers more
# than they save; 10 ms late is nothing beside a 250 ms scrape.
PACE_SECONDS = 0.01
_MAX_ID_CHARS = 256
_MAX_HASH = (1 << 64) - 1
_MAX_REPLICAS = 4096
_MAX_PENDING = 1e12

Placement = tuple[str, list[int]]  # replica id, checkpoint hashes of the prompt


class PlacementLog:
    """This router's own placements, numbered from 1, the latest LOG_CAPACITY kept.

    `epoch` names this process: a reader whose epoch differs (the router
    restarted) reads from the oldest entry kept."""

    def __init__(self, capacity: int = LOG_CAPACITY) -> None:
        self.epoch = uuid.uuid4().hex
        self.head = 0  # number of the latest placement
        self._entries: deque[Placement] = deque(maxlen=capacity)
        self._changed = asyncio.Event()
        self._closed = False
        self._touched = 0  # bumped when this router's queue estimates changed

    def append(self, replica: str, hashes: list[int]) -> None:
        if not hashes:
            return
        self._entries.append((replica, hashes))
        self.head += 1
        self._changed.set()

    def read(self, epoch: str | None, after: int, limit: int = MAX_PER_READ) -> list[Placement]:
        """Placements numbered after `after` (of this epoch), oldest first, at most `limit`;
        the last one returned is numbered `after + len(...)`, or from the oldest kept when
        `after` is of another epoch, ahead of `head`, or too old (see `start`)."""
        start = self.start(epoch, after)
        oldest = self.head - len(self._entries)
        stop = min(self.head, start + limit)
        return [self._entries[i - oldest] for i in range(start, stop)]

    def start(self, epoch: str | None, after: int) -> int:
        """The number before the first placement a read from (epoch, after) returns."""
        oldest = self.head - len(self._entries)
        if epoch != self.epoch or after > self.head:
            return oldest
        return max(after, oldest)

    def touch(self) -> None:
        """This router's pending prefill changed: waiting readers answer (with no
        new placement), so peers see a queue drain as soon as one that grows."""
        self._touched += 1
        self._changed.set()

    @property
    def touched(self) -> int:
        """The version of this router's pending prefill: answers carry it, and a
        read that brings back an older one is answered at once."""
        return self._touched

    def close(self) -> None:
        """Readers stop waiting (the router is draining)."""
        self._closed = True
        self._changed.set()

    async def wait(
        self, epoch: str | None, after: int, seconds: float, *, touched: int | None = None
    ) -> None:
        """Until a read from (epoch, after) has something, or this router's
        pending prefill changed since the reader's version `touched`, or
        `seconds` passed. A change between two reads counts: the reader was
        not waiting then. Without a version of this process (a reader of an
        older router, or of another epoch), only a change while it waits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        seen = self._touched
        if touched is not None and epoch == self.epoch:
            seen = min(touched, seen)  # one ahead of this router's is none it gave
        while self.start(epoch, after) >= self.head and not self._closed and seen == self._touched:
            self._changed.clear()
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return


def encode(
    log_: PlacementLog, epoch: str | None, after: int, pending: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """One answer of GET /placements: the placements and the cursor that follows them,
    and this router's own pending prefill per replica (tokens, the nonzero ones)
    and its version."""
    start = log_.start(epoch, after)
    placements = log_.read(epoch, after)
    return {
        "epoch": log_.epoch,
        "next": start + len(placements),
        "placements": [[replica, hashes] for replica, hashes in placements],
        "pending": {r: round(tokens) for r, tokens in (pending or {}).items() if tokens >= 0.5},
        "touched": log_.touched,
    }


class BadAnswer(ValueError):
    """A peer's answer that is not a placements answer."""


class PeerDraining(BadAnswer):
    """A peer that is shutting down (503): read again later, as a failing one."""


@dataclass(frozen=True)
class Answer:
    epoch: str
    next: int
    placements: list[Placement]
    pending: dict[str, float]
    touched: int | None = None  # None: a router of a version that keeps none


def decode(body: Any, *, max_hashes: int) -> Answer:
    """A peer's answer, checked: a peer is another pod, and what it says goes into
    this router's index (bounded: at most max_hashes per placement)."""
    if not isinstance(body, dict):
        raise BadAnswer("not an object")
    epoch, cursor, raw = body.get("epoch"), body.get("next"), body.get("placements")
    if not isinstance(epoch, str) or len(epoch) > _MAX_ID_CHARS:
        raise BadAnswer("epoch")
    if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
        raise BadAnswer("next")
    if not isinstance(raw, list) or len(raw) > MAX_PER_READ:
        raise BadAnswer("placements")
    placements = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise BadAnswer("placement")
        replica, hashes = item
        if not isinstance(replica, str) or len(replica) > _MAX_ID_CHARS:
            raise BadAnswer("replica")
        if not isinstance(hashes, list) or len(hashes) > max_hashes:
            raise BadAnswer("hashes")
        if not all(type(h) is int and 0 <= h <= _MAX_HASH for h in hashes):
            raise BadAnswer("hash")
        placements.append((replica, hashes))
    pending = body.get("pending", {})
    if not isinstance(pending, dict) or len(pending) > _MAX_REPLICAS:
        raise BadAnswer("pending")
    for replica, tokens in pending.items():
        if len(replica) > _MAX_ID_CHARS:
            raise BadAnswer("pending replica")
        if type(tokens) not in (int, float) or not 0 <= tokens <= _MAX_PENDING:
            raise BadAnswer("pending tokens")
    touched = body.get("touched")
    if touched is not None and (type(touched) is not int or touched < 0):
        raise BadAnswer("touched")
    return Answer(
        epoch=epoch,
        next=cursor,
        placements=placements,
        pending={r: float(t) for r, t in pending.items()},
        touched=touched,
    )


Record = Callable[[str, Sequence[int]], None]
# A peer's (by URL) pending prefill per replica, replacing what it said before;
# {} when it is gone or unreachable.
Pending = Callable[[str, dict[str, float]], None]


@dataclass
class PeerSync:
    """Follows each peer's placement log and records what it reads. `set_peers`
    with the peers' base URLs (their internal port) starts and stops the readers."""

    record: Record
    max_hashes: int
    wait_seconds: float = WAIT_SECONDS
    retry_seconds: tuple[float, float] = RETRY_SECONDS  # a failing peer: first, longest wait
    pace_seconds: float = PACE_SECONDS
    received: Callable[[int], None] = lambda count: None
    pending: Pending = lambda peer, queued: None
    # The Authorization header to read peers with: with spec.router.apiKeySecret
    # every router pod has the same keys, and reading placements takes one.
    authorization: Callable[[], str | None] = lambda: None
    _readers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    def set_peers(self, urls: Iterable[str]) -> None:
        wanted = set(urls)
        for url in set(self._readers) - wanted:
            self._readers.pop(url).cancel()
            self.pending(url, {})
        loop = asyncio.get_running_loop()
        for url in wanted - set(self._readers):
            self._readers[url] = loop.create_task(self._follow(url))

    @property
    def peers(self) -> list[str]:
        return sorted(self._readers)

    async def close(self) -> None:
        readers = list(self._readers.values())
        for url in self._readers:
            self.pending(url, {})
        self._readers.clear()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.wait_seconds + 5, connect=2)
            )
        return self._session

    async def _follow(self, url: str) -> None:
        epoch: str | None = None
        after = 0
        touched: int | None = None
        first, longest = self.retry_seconds
        retry = first
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                answer = await self._read(url, epoch, after, touched=touched)
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                # Said once a spell (its hits are lost meanwhile), not at each
                # retry; a peer shutting down is a rollout's way, no warning.
                said = log.debug if retry != first else log.warning
                if retry == first and isinstance(error, PeerDraining):
                    said = log.info
                said("placements of peer %s unread (%s); again in %.1fs", url, error, retry)
                self.pending(url, {})  # an unreachable peer's queue is not counted
                await asyncio.sleep(retry)
                retry = min(retry * 2, longest)
                continue
            if retry != first:
                log.info("placements of peer %s read again", url)
            retry = first
            for replica, hashes in answer.placements:
                self.record(replica, hashes)
            if answer.placements:
                self.received(len(answer.placements))
            self.pending(url, answer.pending)
            epoch, after, touched = answer.epoch, answer.next, answer.touched
            await asyncio.sleep(max(started + self.pace_seconds - loop.time(), 0.0))

    async def _read(
        self, url: str, epoch: str | None, after: int, *, touched: int | None
    ) -> Answer:
        params = {"after": str(after), "wait": _seconds(self.wait_seconds)}
        if epoch is not None:
            params["epoch"] = epoch
        if touched is not None:
            params["touched"] = str(touched)
        header = self.authorization()
        headers = {"Authorization": header} if header else None
        async with self._client().get(
            url + PLACEMENTS_PATH, params=params, headers=headers
        ) as response:
            if response.status == 503:
                raise PeerDraining("draining")
            if response.status != 200:
                raise BadAnswer(f"status {response.status}")
            # Bounded: a peer is another pod, and its answer is read whole.
            raw = await read_whole(response, limit=max_answer_bytes(self.max_hashes))
            return decode(loads(raw), max_hashes=self.max_hashes)


def max_answer_bytes(max_hashes: int) -> int:
    """The longest answer a peer can give honestly: a full read of the longest prompts."""
    return 1024 + MAX_PER_READ * (_MAX_ID_CHARS + 16 + max_hashes * 22)


def _seconds(value: float) -> str:
    return f"{value:g}" if math.isfinite(value) else "0"
