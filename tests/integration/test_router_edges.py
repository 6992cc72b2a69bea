"""Router behaviour at the edges: API keys, body limits, broken metrics,
hot prefixes and graceful drain."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx

from shoal.procs import LocalProcess, http_status, start_router, wait_until
from tests.integration.procs import MODEL, free_port, router, sims, wait_scraped


def _post(url: str, body: object, **kwargs: object) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=30, **kwargs)  # type: ignore[arg-type]


def test_api_keys_are_required_when_configured(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-one\nsk-two\n")
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    with (
        sims(1, tmp_path) as urls,
        router(urls, tmp_path, config={"apiKeyFile": str(keys)}) as front,
    ):
        missing = _post(front, body)
        assert missing.status_code == 401
        assert missing.json()["error"]["type"] == "AuthenticationError"
        assert _post(front, body, headers={"Authorization": "Bearer sk-nope"}).status_code == 401
        assert _post(front, body, headers={"Authorization": "Bearer sk-two"}).status_code == 200
        # The model list says what is served: behind the key too.
        assert httpx.get(front + "/v1/models", timeout=10).status_code == 401
        models = httpx.get(
            front + "/v1/models", headers={"Authorization": "Bearer sk-one"}, timeout=10
        )
        assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
        # Probes stay open: kubelet sends no key.
        assert httpx.get(front + "/ready", timeout=10).status_code == 200


def test_rotated_keys_are_taken_up_without_a_restart(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-old\n")
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}

    def status(key: str) -> int:
        return _post(front, body, headers={"Authorization": f"Bearer {key}"}).status_code

    def rewrite(text: str) -> None:
        staged = tmp_path / "keys.new"
        staged.write_text(text)
        staged.replace(keys)  # atomic, as kubelet swaps a Secret's files

    config = {"apiKeyFile": str(keys), "apiKeyReloadSeconds": 1}
    with sims(1, tmp_path) as urls, router(urls, tmp_path, config=config) as front:
        assert status("sk-old") == 200 and status("sk-new") == 401
        rewrite("sk-new\n")
        wait_until(lambda: status("sk-new") == 200, what="the new key", timeout=10, interval=0.1)
        assert status("sk-old") == 401
        # A Secret emptied by mistake must not open the router, nor close it.
        rewrite("")
        wait_until(
            lambda: "keeping the previous 1 key(s)" in (tmp_path / "router.log").read_text(),
            what="the emptied file read",
            timeout=10,
            interval=0.1,
        )
        assert status("sk-new") == 200 and status("sk-old") == 401
        assert _post(front, body).status_code == 401


def test_the_api_key_file_flag_overrides_the_config_and_a_missing_file_stops_the_router(
    tmp_path: Path,
) -> None:
    flagged = tmp_path / "flagged"
    flagged.write_text("sk-flag\n")
    configured = tmp_path / "configured"
    configured.write_text("sk-config\n")
    config = {"apiKeyFile": str(configured)}
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}

    def start(key_file: Path) -> LocalProcess:
        args = ["--api-key-file", str(key_file)]
        log = tmp_path / f"router-{key_file.name}.log"
        return start_router(log=log, config=config, endpoints=urls, args=args)

    with sims(1, tmp_path) as urls:
        absent = tmp_path / "absent"
        with start(absent) as missing:
            assert missing.wait_exit(timeout=30) != 0
        assert f"API key file {absent}: No such file" in missing.log.read_text()

        with start(flagged) as flagged_router:
            flagged_router.wait_http("/ready")
            front = flagged_router.url
            headers = {"Authorization": "Bearer sk-flag"}
            assert _post(front, body, headers=headers).status_code == 200
            headers = {"Authorization": "Bearer sk-config"}
            assert _post(front, body, headers=headers).status_code == 401


def test_oversized_body_is_refused_with_an_openai_error(tmp_path: Path) -> None:
    with (
        sims(1, tmp_path) as urls,
        router(urls, tmp_path, config={"maxRequestSize": "4096"}) as front,
    ):
        big = _post(front, {"model": MODEL, "prompt": "x" * 10_000, "max_tokens": 1})
        assert big.status_code == 413
        assert big.json()["error"]["code"] == 413
        assert (
            _post(front, {"model": MODEL, "prompt": "x" * 100, "max_tokens": 1}).status_code == 200
        )


def test_broken_metrics_count_as_full_load_but_never_cause_an_outage(tmp_path: Path) -> None:
    body = {"model": MODEL, "prompt": "route me", "max_tokens": 1}
    with (
        sims(1, tmp_path, extra=["--sim-broken-metrics", "error"]) as broken,
        sims(1, tmp_path / "..", extra=[]) as healthy,
        router([*broken, *healthy], tmp_path) as front,
    ):
        time.sleep(1.0)  # a few scrape rounds
        placed = {_post(front, body).headers["x-shoal-replica"] for _ in range(8)}
        assert placed == {healthy[0].removeprefix("http://")}
    with (
        sims(2, tmp_path, extra=["--sim-broken-metrics", "garbage"]) as urls,
        router(urls, tmp_path, config={"policy": "least-request"}, name="r2") as front,
    ):
        time.sleep(1.0)
        # Every replica's metrics are stale: route on in-flight counts instead.
        responses = [_post(front, body) for _ in range(6)]
        assert all(r.status_code == 200 for r in responses)


def test_hot_prefixes_are_served_on_the_internal_port_only_and_with_a_key(
    tmp_path: Path,
) -> None:
    """Their text is the users' prompts: as private as the API they came
    through (placements, hashes of it, asked a key already)."""
    internal = free_port()
    shared = "You are the support assistant of ACME. Answer briefly and kindly. " * 6
    (tmp_path / "keys").write_text("sk-one\n")
    config = {
        "hotPrefixes": {"enabled": True, "maxPrefixes": 4},
        "internalPort": internal,
        "apiKeyFile": str(tmp_path / "keys"),
    }
    keyed = {"Authorization": "Bearer sk-one"}
    with sims(1, tmp_path) as urls, router(urls, tmp_path, config=config) as front:
        for i in range(5):
            body = {"model": MODEL, "prompt": shared + f"Q{i}?", "max_tokens": 1}
            answer = httpx.post(front + "/v1/completions", json=body, headers=keyed, timeout=10)
            assert answer.status_code == 200, answer.text
        inside = f"http://127.0.0.1:{internal}/hot-prefixes"
        assert httpx.get(inside, timeout=5).status_code == 401
        hot = httpx.get(inside, headers=keyed, timeout=5).json()
        prompts = [p["prompt"] for p in hot["prefixes"]]
        assert prompts and all(shared.startswith(p) for p in prompts)
        assert max(len(p) for p in prompts) >= 256
        assert httpx.get(front + "/hot-prefixes", timeout=5).status_code == 404


def _wait_draining(front: str) -> None:
    """Until the router, signalled, says it is draining (no longer Ready)."""
    wait_until(
        lambda: http_status(front + "/ready") == 503,
        what="the router draining: /ready 503",
        timeout=10,
        interval=0.05,
    )


def test_sigterm_drains_in_flight_streams_before_exit(tmp_path: Path) -> None:
    with (
        sims(1, tmp_path, time_scale=1.0) as urls,
        start_router(log=tmp_path / "router.log", endpoints=urls) as process,
    ):
        front = process.url
        process.wait_http("/ready")
        received: list[bytes] = []
        flowing = threading.Event()

        def stream() -> None:
            with httpx.stream(
                "POST",
                front + "/v1/completions",
                timeout=60,
                json={
                    "model": MODEL,
                    "prompt": "long",
                    "max_tokens": 1500,  # ~3 s at time scale 1
                    "ignore_eos": True,
                    "stream": True,
                },
            ) as response:
                for piece in response.iter_raw():
                    received.append(piece)
                    flowing.set()

        worker = threading.Thread(target=stream)
        worker.start()
        # In flight for sure, whatever a busy CPU makes of the thread's start.
        assert flowing.wait(30), "the stream never started"
        process.popen.send_signal(signal.SIGTERM)
        _wait_draining(front)
        worker.join(timeout=60)
        assert b"".join(received).rstrip().endswith(b"data: [DONE]"), "the stream was cut"
        assert process.wait_exit(timeout=30) == 0


def _exchange(connection: socket.socket, path: str) -> bytes:
    """GET path on a kept-alive connection; the answer's head (its body read)."""
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )  # fmt: skip
    while len(body) < length:
        body += connection.recv(65536)
    return head


def test_draining_moves_kept_alive_clients_off_and_serves_those_that_still_come(
    tmp_path: Path,
) -> None:
    # Behind a Service, a kept-alive client stays with a stopping router: each
    # answer from then on closes its connection, so its client reconnects (to
    # another router), and one idle for a second is closed. New connections
    # are still served (kube-proxy may send them until its rules change).
    with (
        sims(1, tmp_path, time_scale=1.0) as urls,
        start_router(log=tmp_path / "router.log", endpoints=urls) as process,
    ):
        front = process.url
        process.wait_http("/ready")
        address = httpx.URL(front)
        kept, idle = (socket.create_connection((address.host, address.port)) for _ in "ab")
        for connection in (kept, idle):
            connection.settimeout(10)
            assert b"connection: close" not in _exchange(connection, "/v1/models").lower()
        done = threading.Event()

        flowing = threading.Event()

        def stream() -> None:  # keeps the drain going
            body = {"model": MODEL, "prompt": "long", "max_tokens": 1500, "stream": True}
            body["ignore_eos"] = True
            with httpx.stream("POST", front + "/v1/completions", json=body, timeout=60) as answer:
                for _ in answer.iter_raw():
                    flowing.set()
            done.set()

        worker = threading.Thread(target=stream)
        worker.start()
        assert flowing.wait(30), "the stream never started"
        process.popen.send_signal(signal.SIGTERM)
        _wait_draining(front)
        head = _exchange(kept, "/v1/models")
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), head
        assert kept.recv(1) == b"", "a connection told to close stays open"
        assert httpx.get(front + "/v1/models", timeout=5).status_code == 200
        assert idle.recv(1) == b"", "the idle connection is not closed"
        assert not done.is_set(), "the idle connection was closed only once the drain ended"
        worker.join(timeout=60)
        assert process.wait_exit(timeout=30) == 0


def test_failures_retried_elsewhere_still_count_against_their_replica(tmp_path: Path) -> None:
    """The operator reads each replica's error rate from these counters: a
    replica that refuses connections must show it even though no client
    saw an error."""
    # Metrics stay fresh for a minute: the router goes on believing the killed
    # replica idle, so round-robin tries it (a stale one would be skipped).
    config = {"policy": "round-robin", "staleAfterMilliseconds": 60000}
    with sims(2, tmp_path) as engines, router(list(engines), tmp_path, config=config) as front:
        alive, dead = (url.removeprefix("http://") for url in engines)
        wait_scraped(front, engines)
        engines.kill(1)
        for i in range(6):
            response = _post(front, {"model": MODEL, "prompt": f"q{i}", "max_tokens": 1})
            assert response.status_code == 200
            assert response.headers["x-shoal-replica"] == alive
        metrics = httpx.get(front + "/metrics", timeout=5).text
    served = f'shoal_router_requests_total{{code="200",replica="{alive}"}} 6.0'
    assert served in metrics, metrics
    refused = f'shoal_router_requests_total{{code="502",replica="{dead}"}}'
    failed = [line for line in metrics.splitlines() if line.startswith(refused)]
    assert failed and float(failed[0].rsplit(" ", 1)[1]) >= 1, metrics


class _RecordingEngine(BaseHTTPRequestHandler):
    """An engine that sets a cookie on every answer and records the headers
    of what reaches it (a real one could sit behind a session-aware proxy)."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self._answer(b"", "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/v1/"):
            type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]}
        self._answer(json.dumps(body).encode(), "application/json")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "engine-session=alice; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_router_keeps_no_cookies_and_asks_no_compression_for_its_clients(
    tmp_path: Path,
) -> None:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _RecordingEngine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        # By name: aiohttp's default cookie jar ignores cookies from IP addresses.
        upstream = f"http://localhost:{engine.server_address[1]}"
        with router([upstream], tmp_path) as front:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
            for _ in range(3):
                assert _post(front, body).status_code == 200
    finally:
        engine.shutdown()
    seen = _RecordingEngine.seen
    assert len(seen) == 3
    # The first answer set a cookie; no later request carried it.
    assert all("cookie" not in headers for headers in seen)
    assert all("accept-encoding" not in headers for headers in seen)
    assert {headers["user-agent"] for headers in seen} == {"shoal-router"}


class _SlowMetricsEngine(BaseHTTPRequestHandler):
    """An engine whose /metrics takes a while to answer."""

    def do_GET(self) -> None:
        time.sleep(1.5)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_router_is_ready_only_after_its_first_scrape_round(tmp_path: Path) -> None:
    """Before it, every replica counts as fully loaded (or some do while others
    were scraped already), which is no state to take requests in."""
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _SlowMetricsEngine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{engine.server_address[1]}"
    started = time.monotonic()
    try:
        with router([upstream], tmp_path, config={"scrapeTimeoutMilliseconds": 5000}) as front:
            waited = time.monotonic() - started  # router() returns once /ready is 200
            metrics = httpx.get(front + "/metrics", timeout=5).text
    finally:
        engine.shutdown()
    assert waited >= 1.5
    name = upstream.removeprefix("http://")
    assert f'shoal_router_load_score{{replica="{name}"}}' in metrics, metrics
