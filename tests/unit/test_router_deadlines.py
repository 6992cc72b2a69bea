"""Deadlines on one loop timer: each fires at its time, in order, unless
cancelled; cancelled ones do not pile up."""

from __future__ import annotations

import asyncio

from shoal.router import deadlines as deadlines_module
from shoal.router.deadlines import Deadlines


def test_deadlines_fire_in_time_order_and_cancelled_ones_never() -> None:
    async def scenario() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, float]] = []
        deadlines = Deadlines()
        start = loop.time()

        def note(name: str) -> None:
            fired.append((name, loop.time() - start))

        # Added out of order: a nearer deadline after a farther one re-arms the timer.
        deadlines.at(start + 0.15, lambda: note("late"))
        deadlines.at(start + 0.05, lambda: note("early"))
        deadlines.at(start + 0.10, lambda: note("cancelled")).cancel()
        deadlines.at(start + 0.10, lambda: note("middle"))
        assert len(deadlines) == 3
        await asyncio.sleep(0.3)
        assert len(deadlines) == 0
        return fired

    fired = asyncio.run(scenario())
    assert [name for name, _ in fired] == ["early", "middle", "late"]
    for (_, at), due in zip(fired, (0.05, 0.10, 0.15), strict=True):
        assert due <= at < due + 0.1


def test_a_failing_callback_does_not_stop_the_later_deadlines() -> None:
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        deadlines = Deadlines()

        def boom() -> None:
            raise RuntimeError("boom")

        deadlines.at(loop.time() + 0.01, boom)
        deadlines.at(loop.time() + 0.02, lambda: fired.append("after"))
        await asyncio.sleep(0.1)
        return fired

    assert asyncio.run(scenario()) == ["after"]


def test_cancelled_deadlines_are_dropped_from_memory() -> None:
    """A deadline is cancelled by nearly every request long before it is due
    (firstByteSeconds is minutes): the heap must not keep them all."""

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        for _ in range(10_000):
            deadlines.at(loop.time() + 600, lambda: None).cancel()
        kept = deadlines.at(loop.time() + 600, lambda: None)
        size = len(deadlines._heap)
        assert len(deadlines) == 1
        kept.cancel()
        deadlines.close()
        return size

    size = asyncio.run(scenario())
    assert size <= 2 * deadlines_module._COMPACT_AT + 2


def test_a_callback_that_cancels_many_others_leaves_the_rest_kept() -> None:
    """Cancelling from a callback may rebuild the heap under the firing."""

    async def scenario() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        deadlines = Deadlines()
        now = loop.time()
        doomed = [deadlines.at(now + 0.5, lambda: fired.append("doomed")) for _ in range(3000)]

        def cancel_them() -> None:
            fired.append("canceller")
            for deadline in doomed:
                deadline.cancel()

        deadlines.at(now + 0.01, cancel_them)
        deadlines.at(now + 0.01, lambda: fired.append("same time"))
        deadlines.at(now + 0.6, lambda: fired.append("later"))
        await asyncio.sleep(0.8)
        return fired, len(deadlines)

    fired, left = asyncio.run(scenario())
    assert fired == ["canceller", "same time", "later"]
    assert left == 0
