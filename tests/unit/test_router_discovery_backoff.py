"""How soon the router's pod watcher lists again (`PodWatcher.run`): at once
after a watch that was up (the server's timeout after minutes, a 410 after
changes), and ever later, up to RELIST_SECONDS' longest, while watches fail
or end at once (an API server shedding load with 429s on watches, a proxy
cutting streams), so two watchers per router do not relist twice a second."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import kr8s.asyncio
import pytest

import shoal.router.discovery as discovery
from shoal.router.discovery import RELIST_SECONDS, PodWatcher, relist_delay, watch_was_up

Watch = list[dict[str, Any] | Exception]  # events delivered, then maybe a failure


class _Stop(BaseException):
    """Ends the watcher's endless loop (not an Exception: it is not retried)."""


class _NoJitter(random.Random):
    def random(self) -> float:
        return 0.0


def _added(name: str) -> dict[str, Any]:
    pod = {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": {"phase": "Pending"}}
    return {"type": "ADDED", "object": pod}


class _Watcher(PodWatcher):
    """Lists always answer; each watch goes as its script says."""

    def __init__(self, watches: list[Watch]) -> None:
        super().__init__(
            namespace="team",
            selector="app=eng",
            engine_port=8000,
            publish=lambda endpoints: None,
            rng=_NoJitter(),
        )
        self.watches = watches

    async def _list(self, api: kr8s.asyncio.Api) -> tuple[dict[str, dict[str, Any]], str]:
        if not self.watches:
            raise _Stop
        return {}, "7"

    async def _events(self, api: kr8s.asyncio.Api, version: str) -> AsyncIterator[dict[str, Any]]:
        for step in self.watches.pop(0):
            if isinstance(step, Exception):
                raise step
            yield step


def _sleeps(watches: list[Watch], monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], int]:
    """The sleeps of a watcher going through `watches`, and its lists."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def connect(**_: Any) -> Any:
        return object()

    monkeypatch.setattr(asyncio, "sleep", sleep)
    monkeypatch.setattr(discovery, "connect", connect)
    watcher = _Watcher(watches)
    with pytest.raises(_Stop):
        asyncio.run(watcher.run())
    return slept, watcher.relists


def test_watches_that_fail_at_once_wait_ever_longer_up_to_the_longest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = ConnectionError("429 Too Many Requests")
    slept, relists = _sleeps([[refused] for _ in range(8)], monkeypatch)
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert relists == 8


def test_watches_that_end_at_once_without_an_event_wait_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept, _ = _sleeps([[] for _ in range(4)], monkeypatch)
    assert slept == [0.5, 1.0, 2.0, 4.0]


def test_a_watch_that_delivered_changes_lists_again_at_once_and_starts_the_waits_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cut = ConnectionResetError("stream cut")
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {}}}
    watches: list[Watch] = [[cut], [cut], [_added("a"), bookmark], [_added("b"), cut], []]
    slept, relists = _sleeps(watches, monkeypatch)
    # Nothing after the clean end of the third; the fourth's failure waits the
    # first delay again, the fifth (empty) the second.
    assert slept == [0.5, 1.0, 0.5, 1.0]
    assert relists == 5


@pytest.mark.parametrize(
    ("events", "seconds", "up"),
    [
        (0, 300.0, True),  # ended at the server's timeout
        (0, 10.0, True),
        (0, 0.2, False),  # cut at once
        (1, 0.2, True),  # a 410 right after a change: the list is what is stale
    ],
)
def test_a_watch_was_up_when_it_delivered_events_or_lasted(
    events: int, seconds: float, up: bool
) -> None:
    assert watch_was_up(events=events, seconds=seconds, timeout=300) is up


def test_a_short_server_timeout_still_counts_as_up() -> None:
    assert watch_was_up(events=0, seconds=4.0, timeout=5)


def test_jitter_only_shortens_a_delay_by_at_most_half() -> None:
    first, longest = RELIST_SECONDS
    assert relist_delay(0, jitter=0.0) == first
    assert relist_delay(100, jitter=0.0) == longest
    assert relist_delay(100, jitter=0.999) > longest / 2
    assert relist_delay(3, jitter=0.5) == first * 8 * 0.75
