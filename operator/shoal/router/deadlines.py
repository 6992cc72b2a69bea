"""Many deadlines on one event-loop timer.

Each request through the router has a deadline that almost never passes (its
first byte within timeouts.firstByteSeconds). On uvloop an asyncio timer costs
1.7 us to start and cancel and `asyncio.timeout_at` 6 us (it also reads the
current task and loop, each a getpid() system call on Python 3.11): together
3% of the router's CPU per small request. Here a deadline is a heap entry and
one loop timer waits for the nearest; a deadline that is cancelled is marked,
and dropped when it reaches the top or when the marked ones are the heap's
majority, so memory stays within twice the live deadlines.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable

log = logging.getLogger("shoal.router")

# Below this many cancelled entries the heap is not worth rebuilding.
_COMPACT_AT = 1024


class Deadline:
    __slots__ = ("_owner", "callback")

    def __init__(self, owner: Deadlines, callback: Callable[[], None]) -> None:
        self._owner = owner
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        if self.callback is not None:
            self.callback = None
            self._owner.cancelled()


class Deadlines:
    """Calls each callback at its loop time unless cancelled first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # equal times go in order, never comparing entries
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._cancelled = 0

    def __len__(self) -> int:
        """Deadlines still to come."""
        return len(self._heap) - self._cancelled

    def at(self, when: float, callback: Callable[[], None]) -> Deadline:
        deadline = Deadline(self, callback)
        heapq.heappush(self._heap, (when, next(self._order), deadline))
        if when < self._timer_at:
            self._arm(when)
        return deadline

    def cancelled(self) -> None:
        self._cancelled += 1
        if self._cancelled > _COMPACT_AT and self._cancelled * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2].callback is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = float("inf")

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        now = asyncio.get_running_loop().time()
        # self._heap read each time: a callback may cancel others and so
        # replace it (compaction).
        while self._heap:
            when, _, deadline = self._heap[0]
            callback = deadline.callback
            if callback is not None and when > now:
                self._arm(when)
                return
            heapq.heappop(self._heap)
            if callback is None:
                self._cancelled -= 1
                continue
            deadline.callback = None
            try:
                callback()
            except Exception:  # the later deadlines must still be kept
                log.exception("a deadline's callback failed")
