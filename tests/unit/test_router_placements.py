"""The placements router replicas share (router/placements.py): the log's
cursors (their touch version wakes a reader whose view of this router's
queue is stale), and what a peer's answer may contain."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from shoal.router.placements import (
    MAX_PER_READ,
    BadAnswer,
    PeerSync,
    PlacementLog,
    decode,
    encode,
)


def _log(count: int, capacity: int = 8) -> PlacementLog:
    log = PlacementLog(capacity=capacity)
    for i in range(count):
        log.append(f"r{i % 3}", [i, i + 1000])
    return log


def test_a_reader_gets_what_follows_its_cursor_then_nothing() -> None:
    log = _log(5)
    first = encode(log, None, 0)
    assert first["next"] == 5
    assert [p[1][0] for p in first["placements"]] == [0, 1, 2, 3, 4]
    again = encode(log, first["epoch"], first["next"])
    assert again["placements"] == [] and again["next"] == 5
    log.append("r9", [77])
    assert encode(log, first["epoch"], 5)["placements"] == [["r9", [77]]]


def test_a_reader_that_fell_behind_resumes_at_the_oldest_kept() -> None:
    log = _log(20, capacity=8)
    answer = encode(log, log.epoch, 3)
    assert answer["next"] == 20
    assert [p[1][0] for p in answer["placements"]] == list(range(12, 20))


def test_a_reader_of_another_epoch_reads_everything_kept() -> None:
    """A router that restarted numbers from 1 again: a peer's cursor from
    before must not skip what the new process placed."""
    log = _log(3)
    for epoch, after in (("an-older-process", 2), (log.epoch, 50)):
        answer = encode(log, epoch, after)
        assert answer["epoch"] == log.epoch
        assert [p[1][0] for p in answer["placements"]] == [0, 1, 2]


def test_one_read_is_bounded() -> None:
    log = _log(MAX_PER_READ + 10, capacity=MAX_PER_READ * 2)
    answer = encode(log, log.epoch, 0)
    assert len(answer["placements"]) == MAX_PER_READ
    assert answer["next"] == MAX_PER_READ
    assert len(encode(log, log.epoch, answer["next"])["placements"]) == 10


def test_a_placement_without_hashes_is_not_kept() -> None:
    log = PlacementLog()
    log.append("r0", [])
    assert log.head == 0


def test_a_long_poll_wakes_on_the_next_placement_and_ends_on_close() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        log = PlacementLog()
        waiter = asyncio.create_task(log.wait(log.epoch, 0, 10))
        await asyncio.sleep(0.01)
        asleep = not waiter.done()
        log.append("r0", [1])
        await asyncio.wait_for(waiter, 1)
        closing = asyncio.create_task(log.wait(log.epoch, 1, 10))
        await asyncio.sleep(0.01)
        log.close()
        await asyncio.wait_for(closing, 1)
        return asleep, waiter.done(), closing.done()

    assert asyncio.run(scenario()) == (True, True, True)


def test_a_long_poll_wakes_when_this_routers_queue_changes() -> None:
    """A prefill done changes nothing in the log but what peers should weigh."""

    async def scenario() -> bool:
        log = _log(2)
        waiter = asyncio.create_task(log.wait(log.epoch, 2, 10))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        log.touch()
        await asyncio.wait_for(waiter, 1)
        return True

    assert asyncio.run(scenario())


def test_a_prefill_done_between_two_reads_answers_the_next_at_once() -> None:
    """The peer was not waiting when its queue estimate changed: its next
    read must not wait up to WAIT_SECONDS counting the stale one."""

    async def scenario() -> None:
        log = _log(2)
        answer = encode(log, None, 0)
        log.touch()
        cursor = (answer["epoch"], answer["next"])
        await asyncio.wait_for(log.wait(*cursor, 10, touched=answer["touched"]), 1)

    asyncio.run(scenario())


def test_a_reader_that_saw_the_latest_change_waits_for_the_next() -> None:
    async def scenario() -> bool:
        log = _log(2)
        log.touch()
        answer = encode(log, None, 0)
        cursor = (answer["epoch"], answer["next"])
        waiter = asyncio.create_task(log.wait(*cursor, 10, touched=answer["touched"]))
        await asyncio.sleep(0.05)
        asleep = not waiter.done()
        log.touch()
        await asyncio.wait_for(waiter, 1)
        return asleep

    assert asyncio.run(scenario())


def test_an_answer_carries_this_routers_own_pending_prefill() -> None:
    log = _log(1)
    answer = encode(log, None, 0, {"r0": 1500.4, "r1": 0.0, "r2": 0.2})
    assert answer["pending"] == {"r0": 1500}
    assert decode(json.loads(json.dumps(answer)), max_hashes=48).pending == {"r0": 1500.0}


def test_a_long_poll_returns_at_its_deadline() -> None:
    async def scenario() -> float:
        log = PlacementLog()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await log.wait(log.epoch, 0, 0.05)
        return loop.time() - started

    assert 0.04 <= asyncio.run(scenario()) < 1.0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "not an object"),
        ({"epoch": 5, "next": 0, "placements": []}, "epoch"),
        ({"epoch": "e", "next": -1, "placements": []}, "next"),
        ({"epoch": "e", "next": True, "placements": []}, "next"),
        ({"epoch": "e", "next": 0, "placements": {}}, "placements"),
        ({"epoch": "e", "next": 0, "placements": [["r"] * 2] * (MAX_PER_READ + 1)}, "placements"),
        ({"epoch": "e", "next": 0, "placements": [["r", [1], 3]]}, "placement"),
        ({"epoch": "e", "next": 0, "placements": [[7, [1]]]}, "replica"),
        ({"epoch": "e", "next": 0, "placements": [["x" * 300, [1]]]}, "replica"),
        ({"epoch": "e", "next": 0, "placements": [["r", list(range(49))]]}, "hashes"),
        ({"epoch": "e", "next": 0, "placements": [["r", [1.5]]]}, "hash"),
        ({"epoch": "e", "next": 0, "placements": [["r", [True]]]}, "hash"),
        ({"epoch": "e", "next": 0, "placements": [["r", [-1]]]}, "hash"),
        ({"epoch": "e", "next": 0, "placements": [["r", [1 << 64]]]}, "hash"),
        ({"epoch": "e", "next": 0, "placements": [], "touched": -1}, "touched"),
        ({"epoch": "e", "next": 0, "placements": [], "touched": True}, "touched"),
        ({"epoch": "e", "next": 0, "placements": [], "touched": "3"}, "touched"),
        ({"epoch": "e", "next": 0, "placements": [], "pending": []}, "pending"),
        ({"epoch": "e", "next": 0, "placements": [], "pending": {"r": -1}}, "pending tokens"),
        ({"epoch": "e", "next": 0, "placements": [], "pending": {"r": "9"}}, "pending tokens"),
        ({"epoch": "e", "next": 0, "placements": [], "pending": {"r": 1e300}}, "pending tokens"),
        ({"epoch": "e", "next": 0, "placements": [], "pending": {"x" * 300: 1}}, "pending replica"),
        (
            {
                "epoch": "e",
                "next": 0,
                "placements": [],
                "pending": {str(i): 1 for i in range(5000)},
            },
            "pending",
        ),
    ],
)
def test_a_hostile_or_broken_answer_is_refused_whole(body: Any, field: str) -> None:
    with pytest.raises(BadAnswer, match=field):
        decode(body, max_hashes=48)


def test_an_honest_answer_round_trips() -> None:
    log = _log(4)
    log.touch()
    answer = decode(json.loads(json.dumps(encode(log, None, 0))), max_hashes=48)
    assert answer.epoch == log.epoch and answer.next == 4
    assert answer.placements[3] == ("r0", [3, 1003])
    assert answer.touched == 1


def test_an_answer_of_a_router_that_counts_no_changes_has_no_touch_version() -> None:
    """A router of an older version (a rollout in progress) says none."""
    assert decode({"epoch": "e", "next": 0, "placements": []}, max_hashes=48).touched is None


def test_a_follower_reads_again_with_the_touch_version_it_read() -> None:
    reads: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        reads.append(dict(request.query))
        return web.json_response({"epoch": "e", "next": 1, "placements": [], "touched": 3})

    async def scenario() -> None:
        runner, url = await _peer(handler)
        sync = PeerSync(record=lambda r, h: None, max_hashes=48, pace_seconds=0.01)
        sync.set_peers([url])
        for _ in range(200):
            if len(reads) >= 2:
                break
            await asyncio.sleep(0.01)
        await sync.close()
        await runner.cleanup()

    asyncio.run(scenario())
    assert "touched" not in reads[0]
    assert reads[1]["touched"] == "3" and reads[1]["after"] == "1"


async def _peer(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> tuple[web.AppRunner, str]:
    """A peer router's placements on loopback, answered by handler."""
    app = web.Application()
    app.router.add_get("/placements", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _recorded_from(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> list[tuple[str, list[int]]]:
    """What a follower of a peer answered by handler records, once it records
    anything (or after 20 s)."""
    runner, url = await _peer(handler)
    recorded: list[tuple[str, list[int]]] = []
    sync = PeerSync(
        record=lambda r, h: recorded.append((r, list(h))),
        max_hashes=48,
        retry_seconds=(0.01, 0.05),
    )
    sync.set_peers([url])
    try:
        for _ in range(400):
            if recorded:
                break
            await asyncio.sleep(0.05)
    finally:
        await sync.close()
        await runner.cleanup()
    return recorded


def test_a_peer_that_answers_garbage_or_too_much_records_nothing_and_is_read_again() -> None:
    """A peer is another pod: what it says goes into the index only when it
    is a placements answer of bounded size; the follower keeps going."""
    answers = [
        web.Response(text="not json", content_type="application/json"),
        web.Response(body=b"[" + b"1," * 2_000_000 + b"1]", content_type="application/json"),
        web.json_response({"epoch": "e", "next": 0, "placements": [["r", ["x"]]]}),
        web.json_response({"epoch": "e", "next": 1, "placements": [["r1", [42, 43]]]}),
    ]
    reads: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        reads.append(dict(request.query))
        if answers:
            return answers.pop(0)
        await asyncio.sleep(0.05)
        return web.json_response({"epoch": "e", "next": 1, "placements": []})

    recorded = asyncio.run(_recorded_from(handler))
    assert recorded == [("r1", [42, 43])]
    assert len(reads) >= 4
    # The cursor follows the accepted answer only.
    assert all(r.get("after") == "0" for r in reads[:4])


def test_an_answer_in_pieces_is_read_whole_and_one_nested_too_deep_stops_no_follower() -> None:
    """A large answer reaches the reader in several network reads; before,
    the first piece alone was decoded (and refused). JSON nested past
    Python's recursion limit raised RecursionError, which ended the
    follower: that peer's placements were never read again."""
    good = json.dumps(
        {"epoch": "e", "next": 1, "placements": [[f"r{i}", [i + 1]] for i in range(300)]}
    ).encode()
    deep = b"[" * 100_000 + b"]" * 100_000
    served = [deep, good]

    async def handler(request: web.Request) -> web.StreamResponse:
        body = served.pop(0) if served else b'{"epoch": "e", "next": 1, "placements": []}'
        answer = web.StreamResponse(headers={"Content-Type": "application/json"})
        await answer.prepare(request)
        half = len(body) // 2
        await answer.write(body[:half])
        await asyncio.sleep(0.05)  # the rest in another network read
        await answer.write(body[half:])
        await answer.write_eof()
        return answer

    recorded = asyncio.run(_recorded_from(handler))
    assert len(recorded) == 300 and recorded[0] == ("r0", [1])


def test_reads_of_a_peer_that_always_has_news_are_paced() -> None:
    """Every prefill done wakes a reader: at thousands of requests a second,
    answers unpaced would cost the routers more than they save."""
    reads = 0

    async def handler(_: web.Request) -> web.Response:
        nonlocal reads
        reads += 1
        return web.json_response({"epoch": "e", "next": reads, "placements": [["r", [reads]]]})

    async def scenario() -> int:
        runner, url = await _peer(handler)
        sync = PeerSync(record=lambda r, h: None, max_hashes=48, pace_seconds=0.1)
        sync.set_peers([url])
        await asyncio.sleep(0.55)
        await sync.close()
        await runner.cleanup()
        return reads

    assert 2 <= asyncio.run(scenario()) <= 7


def test_a_peer_that_stops_answering_is_said_once_and_so_is_its_return(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator sees in the router's log that a peer is unread (hits lost),
    once, not at each retry, and that it is read again; a peer shutting down
    (503) is a rollout's way, said without a warning."""
    answers = [500, 500, 500, 500, 200, 503, 503, 200]

    async def handler(_: web.Request) -> web.Response:
        status = answers.pop(0) if answers else 200
        if status != 200:
            return web.Response(status=status)
        return web.json_response({"epoch": "e", "next": 1, "placements": []})

    async def scenario() -> None:
        runner, url = await _peer(handler)
        sync = PeerSync(
            record=lambda r, h: None, max_hashes=48, retry_seconds=(0.01, 0.05), wait_seconds=0
        )
        sync.set_peers([url])
        for _ in range(400):
            if not answers:
                break
            await asyncio.sleep(0.01)
        await sync.close()
        await runner.cleanup()

    with caplog.at_level(logging.DEBUG, logger="shoal.router.placements"):
        asyncio.run(scenario())
    said = [(r.levelname, r.getMessage().split(" ", 4)[-1]) for r in caplog.records]
    assert not answers
    assert [m for level, m in said if level == "WARNING"] == [
        "unread (status 500); again in 0.0s"
    ], said
    assert [m for level, m in said if level == "INFO"] == [
        "read again",
        "unread (draining); again in 0.0s",
        "read again",
    ], said
