"""Router replicas share their placements (router/placements.py): a
conversation whose next turn reaches another router keeps the replica that
caches its history. Real routers and simulators on loopback."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal.procs import HOST, free_port, start_router
from tests.integration.procs import MODEL, sims

PEER_PLACEMENTS = "shoal_router_peer_placements_total"


@contextmanager
def _router(
    tmp: Path,
    name: str,
    engines: list[str],
    *,
    internal: int,
    peer: int,
    config: dict[str, Any],
    args: tuple[str, ...] = (),
) -> Iterator[str]:
    config = {"replicaHeader": True, "internalPort": internal, **config}
    with start_router(
        log=tmp / f"{name}.log",
        config=config,
        endpoints=engines,
        args=["--peers", f"http://{HOST}:{peer}", *args],
    ) as process:
        process.wait_http("/ready", timeout=20)
        yield process.url


def _turn(front: str, prompt: str, key: str | None = None) -> str:
    response = httpx.post(
        front + "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
        headers={"Authorization": f"Bearer {key}"} if key else None,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-shoal-replica"]


def _read_from_peers(front: str) -> float:
    for line in httpx.get(front + "/metrics", timeout=5).text.splitlines():
        if line.startswith(PEER_PLACEMENTS + " "):
            return float(line.split()[1])
    return 0.0


def _wait_read(front: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while _read_from_peers(front) < count:
        assert time.monotonic() < deadline, f"{front} read {_read_from_peers(front)} of {count}"
        time.sleep(0.05)


def _first_turn(i: int) -> str:
    return f"Conversation {i}. " + f"Its own long history, part {i}. " * 20 + "First question?"


@pytest.mark.parametrize("share", [True, False])
def test_a_conversations_next_turn_through_another_router_keeps_its_replica(
    tmp_path: Path, share: bool
) -> None:
    """Router A places first turns round-robin, so where a conversation lives
    is nothing router B could work out for itself; B, cache-aware, sends each
    second turn where A sent the first only if it read A's placements. B starts
    after A's first dozen (it catches up from A's log), then follows A live."""
    internal_a, internal_b = free_port(), free_port()
    with sims(4, tmp_path) as fleet:
        engines = list(fleet)
        with _router(
            tmp_path,
            "a",
            engines,
            internal=internal_a,
            peer=internal_b,
            config={"policy": "round-robin"},
        ) as a:
            before = [_turn(a, _first_turn(i)) for i in range(12)]
            assert len(set(before)) == 4, before  # spread: else the test proves nothing
            with _router(
                tmp_path,
                "b",
                engines,
                internal=internal_b,
                peer=internal_a,
                config={"policy": "cache-aware", "sharePlacements": share},
            ) as b:
                if share:
                    _wait_read(b, 12)
                live = [_turn(a, _first_turn(i)) for i in range(12, 24)]
                if share:
                    _wait_read(b, 24)
                first = before + live
                second = [
                    _turn(b, _first_turn(i) + " An answer. Second question?") for i in range(24)
                ]
                kept = sum(x == y for x, y in zip(first, second, strict=True))
                if share:
                    assert kept == 24, list(zip(first, second, strict=True))
                else:
                    # Without the placements B places the new prompts by itself.
                    assert _read_from_peers(b) == 0
                    assert kept < 24


def test_with_api_keys_placements_are_read_with_a_key(tmp_path: Path) -> None:
    """Placements are hashes of prompt prefixes: behind spec.router.apiKeySecret
    they take a key, and router pods (which mount the same Secret) read each
    other's with the first one."""
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-first-0001\nsk-second-0002\n")
    internal_a, internal_b = free_port(), free_port()
    with (
        sims(2, tmp_path) as engines,
        _router(
            tmp_path,
            "a",
            list(engines),
            internal=internal_a,
            peer=internal_b,
            config={},
            args=("--api-key-file", str(keys)),
        ) as a,
        _router(
            tmp_path,
            "b",
            list(engines),
            internal=internal_b,
            peer=internal_a,
            config={},
            args=("--api-key-file", str(keys)),
        ) as b,
    ):
        placements = f"http://{HOST}:{internal_a}/placements"
        assert httpx.get(placements, timeout=5).status_code == 401
        wrong = {"Authorization": "Bearer sk-wrong"}
        assert httpx.get(placements, headers=wrong, timeout=5).status_code == 401
        for i in range(3):
            _turn(a, _first_turn(i), key="sk-second-0002")
        _wait_read(b, 3)
        right = {"Authorization": "Bearer sk-second-0002"}
        answer = httpx.get(placements, headers=right, timeout=5).json()
        assert len(answer["placements"]) == 3


@contextmanager
def _counting_proxy(target: str) -> Iterator[tuple[str, list[float]]]:
    """A plain HTTP relay to target that notes when each GET came."""
    came: list[float] = []

    class Relay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            came.append(time.monotonic())
            try:
                answer = httpx.get(target + self.path, headers=dict(self.headers), timeout=10)
            except httpx.HTTPError:
                self.send_error(502)
                return
            self.send_response(answer.status_code)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer((HOST, 0), Relay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}", came
    finally:
        server.shutdown()
        server.server_close()


def test_a_draining_routers_peers_stop_reading_it(tmp_path: Path) -> None:
    """A draining router gives no placements: its peers back off from it as
    from a failing one instead of asking again at once, 100 times a second,
    while its last requests finish."""
    internal_a, internal_b = free_port(), free_port()
    with (
        sims(1, tmp_path, time_scale=1.0) as fleet,
        _counting_proxy(f"http://{HOST}:{internal_a}") as (to_a, came),
    ):
        engines = list(fleet)
        with (
            start_router(
                log=tmp_path / "a.log",
                config={"replicaHeader": True, "internalPort": internal_a},
                endpoints=engines,
                args=["--peers", f"http://{HOST}:{internal_b}"],
            ) as a,
            start_router(
                log=tmp_path / "b.log",
                config={"replicaHeader": True, "internalPort": internal_b},
                endpoints=engines,
                args=["--peers", to_a],
            ) as b,
        ):
            a.wait_http("/ready", timeout=20)
            b.wait_http("/ready", timeout=20)
            body = {"model": MODEL, "prompt": "long", "max_tokens": 400, "ignore_eos": True}
            in_flight = threading.Thread(
                target=httpx.post,
                args=(a.url + "/v1/completions",),
                kwargs={"json": body, "timeout": 60},
            )
            in_flight.start()  # keeps A draining for a few seconds
            time.sleep(0.3)
            a.popen.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert a.wait_exit(timeout=40) == 0
            drained = time.monotonic() - signalled
            in_flight.join(10)
            polls = sum(1 for t in came if signalled <= t)
            assert drained > 1, (
                "the request in flight did not hold the drain: the test shows nothing"
            )
            assert polls <= 10, f"B read draining A {polls} times in {drained:.1f}s"
