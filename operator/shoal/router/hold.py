"""Requests held while the fleet has no replica to route to (scaled to zero,
or its only replica not yet warm): each waits on a future of its own, and
they are released in arrival order once one is routable, so the first to
come is the first sent. The autoscaler sees them in shoal_router_queue_depth."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class HeldRequests:
    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self, seconds: float) -> bool:
        """Hold until released (True) or for at most seconds (False)."""
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(held)
        try:
            await asyncio.wait_for(held, timeout=seconds)
            return True
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove(held)

    def release(self) -> None:
        """Every held request, in arrival order."""
        while self._waiting:
            held = self._waiting.popleft()
            if not held.done():
                held.set_result(None)
