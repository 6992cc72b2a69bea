"""Router throughput and added latency, over real sockets on loopback.

Placement: the router runs alone on core 0 (taskset); the load generators
(wrk, and this process's stream client) and the instant upstream share core 1.
So the router's core measures only the router, and the client's cost is the
same whether it calls the upstream directly or through the router.

- Throughput: wrk drives small non-streamed completions directly at the
  instant upstream and at the router, alternately, `--rounds` times each.
  Target: >= 2,500 requests/s through the router. `--workload NAME` sends
  instead the first request of that benchmark workload, not streamed and one
  token long (shared-prefix: a ~9 KB chat with a long system prompt): the
  routers' cost per request on the prompts the routing benchmarks send.
- Added latency: `--streams` (256) concurrent streams in a closed loop, each
  streaming one completion after another, directly and through the router,
  alternately (in the same run, against the same upstream process). The
  client is a minimal HTTP/1.1 protocol on uvloop (a few microseconds per
  chunk, so it does not saturate at 256 streams the way a high-level Python
  client does). Per request it records the time to the first chunk (TTFT) and
  to the end of the stream; per chunk, the one-way delay from the upstream
  writing it (its CLOCK_MONOTONIC stamp `"t"`) to the client reading it.
  Added latency is routed minus direct, per round; the report gives the
  median over rounds. Target: p50 <= 1 ms, p99 <= 3 ms. `--chunks` sets the
  stream length: 16 (the default) makes 256 streams start ~770 completions a
  second, which loads the router's per-request path; 128 is `vllm bench
  serve`'s default output length.
- Optionally (`--wrk-streams`), the same stream load from wrk as a cross-check
  of the end-to-end latency with a C client.
- Optionally (`--floor`), the same streams through a bare TCP relay on the
  router's core: the latency that any proxy adds with this placement (two
  wake-ups across cores per chunk, and whatever else runs on the machine),
  against which the router's own share can be judged.

- Peers (`--peers vllm-router,smg`, the default): each peer router, pinned to
  the router's core like shoal's, in the same wrk rounds (cache_aware, their
  default policy), at `--connections` and at `--low-connections` (4), where
  p50 / p99 latency rather than throughput is compared.
- Optionally (`--server-floors`), in the same wrk rounds, HTTP servers
  alone on the router's core that answer without an upstream
  (bench/server_floor.py): aiohttp's, with and without an Application (the
  router's is without), and a bare httptools protocol, answering in its
  callback or from a task per request. Their CPU per request is how much of
  the router's is its server's, and how much a leaner server could take out.

CPU seconds of the router, the upstream and this process are reported per
phase, with the load average before and after: a router phase whose router CPU
is near 100% of the wall time means the router core saturated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import uvloop

from shoal.bench.peers import expand_peers, parse_peer_policy, start_peer, wait_routing
from shoal.bench.server_floor import FloorServer
from shoal.bench.server_floor import serve as serve_floor
from shoal.bench.stats import percentile
from shoal.bench.workloads import GENERATORS, synthetic
from shoal.engine.endpoints import COMPLETIONS
from shoal.procs import (
    HOST,
    LocalProcess,
    free_port,
    free_ports,
    start,
    start_router,
    wait_http,
    wait_scraped,
)

ROUTER_CORE = 0
LOAD_CORE = 1

_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
done = function(summary, latency, requests)
  io.write(string.format("LAT %%d %%d %%d %%d\\n", summary.requests,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def _taskset(core: int) -> list[str]:
    return ["taskset", "-c", str(core)]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


@dataclass
class Meter:
    """CPU use of the processes that matter, over one phase."""

    pids: dict[str, int]
    started: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    load_before: str = ""

    def __enter__(self) -> Meter:
        self.load_before = _loadavg()
        self.started = time.monotonic()
        self.cpu = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        return self

    def __exit__(self, *_: object) -> None:
        wall = time.monotonic() - self.started
        self.cpu = {
            name: round((_cpu_seconds(pid) - self.cpu[name]) / wall, 2)
            for name, pid in self.pids.items()
        }
        self.cpu["load_before"] = self.load_before  # type: ignore[assignment]
        self.cpu["load_after"] = _loadavg()  # type: ignore[assignment]


# ---- wrk


@dataclass(frozen=True)
class Request:
    """What wrk sends: one body, again and again."""

    body: bytes
    path: str = COMPLETIONS


_PLAIN = Request(b'{"model": "m", "prompt": "Say hello to the router benchmark.", "max_tokens": 1}')
_STREAM = Request(b'{"model": "m", "prompt": "stream please", "max_tokens": 16, "stream": true}')


def workload_request(name: str) -> Request:
    """The first request of a named benchmark workload, not streamed and one
    token long."""
    first = synthetic(name, count=1).requests[0]
    body = {**first.body("m"), "stream": False, "max_tokens": 1}
    del body["stream_options"]
    return Request(json.dumps(body).encode(), first.path)


def _wrk(
    port: int, *, seconds: float, connections: int, request: Request, tmp: Path
) -> dict[str, float]:
    script = tmp / "post.lua"
    script.write_text(_LUA % request.body.decode())
    out = subprocess.run(
        [
            "taskset",
            "-c",
            str(LOAD_CORE),
            "wrk",
            "-t",
            "1",
            "-c",
            str(connections),
            "-d",
            f"{max(1, round(seconds))}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}{request.path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    lat = re.search(r"LAT (\d+) (\d+) (\d+) (\d+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    if rps is None or lat is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return {
        "requests_per_second": float(rps.group(1)),
        "p50_ms": int(lat.group(2)) / 1e3,
        "p99_ms": int(lat.group(3)) / 1e3,
        "non_2xx": float(errors.group(1)) if errors else 0.0,
        "socket_errors": socket_errors.group(1) if socket_errors else "",  # type: ignore[dict-item]
    }


# ---- the stream client


@dataclass
class StreamSamples:
    ttft_ns: list[int] = field(default_factory=list)
    total_ns: list[int] = field(default_factory=list)
    chunk_delay_ns: list[int] = field(default_factory=list)
    errors: int = 0


class _StreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection streaming completions one after
    another until `deadline`; parses just enough (status line, chunked or
    Content-Length body) and timestamps on arrival."""

    def __init__(
        self, request: bytes, deadline: int, samples: StreamSamples, done: asyncio.Future[None]
    ) -> None:
        self.request = request
        self.deadline = deadline
        self.samples = samples
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.sent_at = 0
        self.first_at = 0
        self.in_body = False
        self.chunked = True
        self.remaining = 0  # Content-Length bodies
        self.record = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.buffer = b""
        self.in_body = False
        self.first_at = 0
        self.sent_at = time.monotonic_ns()
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if self.sent_at:
                self.samples.errors += 1
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buffer = self.buffer + data
        if not self.in_body:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                self.buffer = buffer
                return
            head = buffer[:end].lower()
            if not head.startswith(b"http/1.1 200"):
                self.samples.errors += 1
            self.chunked = b"transfer-encoding: chunked" in head
            if not self.chunked:
                match = re.search(rb"content-length: *(\d+)", head)
                self.remaining = int(match.group(1)) if match else 0
            buffer = buffer[end + 4 :]
            self.in_body = True
        if not self.chunked:
            self.remaining -= len(buffer)
            self.buffer = b""
            if self.first_at == 0 and buffer:
                self.first_at = now
            if self.remaining <= 0:
                self._finished(now)
            return
        pos = 0
        while True:
            line_end = buffer.find(b"\r\n", pos)
            if line_end < 0:
                break
            size = int(buffer[pos:line_end].split(b";", 1)[0], 16)
            if size == 0:
                if len(buffer) < line_end + 4:
                    break
                self.buffer = b""
                self._finished(now)
                return
            if len(buffer) < line_end + 2 + size + 2:
                break
            payload = buffer[line_end + 2 : line_end + 2 + size]
            pos = line_end + 2 + size + 2
            if self.first_at == 0:
                self.first_at = now
            at = payload.find(b'"t":')
            while at >= 0:
                stop = payload.find(b"}", at)
                if self.record:
                    self.samples.chunk_delay_ns.append(now - int(payload[at + 4 : stop]))
                at = payload.find(b'"t":', stop)
        self.buffer = buffer[pos:]

    def _finished(self, now: int) -> None:
        if self.record:
            self.samples.ttft_ns.append(self.first_at - self.sent_at)
            self.samples.total_ns.append(now - self.sent_at)
        if now < self.deadline:
            self._send()
        else:
            self.sent_at = 0
            assert self.transport is not None
            self.transport.close()


async def _streams(
    port: int, *, concurrency: int, seconds: float, warmup: float
) -> dict[str, float]:
    """A closed loop of `concurrency` connections; starts are staggered over
    the warm-up, whose requests are not recorded."""
    loop = asyncio.get_running_loop()
    request = (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (_STREAM.path.encode(), port, len(_STREAM.body), _STREAM.body)
    )
    samples = StreamSamples()
    deadline = time.monotonic_ns() + int((warmup + seconds) * 1e9)
    connections: list[_StreamConnection] = []
    futures: list[asyncio.Future[None]] = []

    async def start(index: int) -> None:
        await asyncio.sleep(warmup * 0.5 * index / concurrency)
        done: asyncio.Future[None] = loop.create_future()
        futures.append(done)
        _, protocol = await loop.create_connection(
            lambda: _StreamConnection(request, deadline, samples, done), "127.0.0.1", port
        )
        protocol.record = False
        connections.append(protocol)

    began = time.monotonic()
    await asyncio.gather(*(start(i) for i in range(concurrency)))
    # The rest of the warm-up: pools filled, steady state reached.
    await asyncio.sleep(max(0.0, warmup - (time.monotonic() - began)))
    for connection in connections:
        connection.record = True
    await asyncio.wait_for(asyncio.gather(*futures), timeout=seconds + 60)
    return {
        "requests": len(samples.total_ns),
        "errors": samples.errors,
        "ttft_p50_ms": _pct(samples.ttft_ns, 50),
        "ttft_p99_ms": _pct(samples.ttft_ns, 99),
        "total_p50_ms": _pct(samples.total_ns, 50),
        "total_p99_ms": _pct(samples.total_ns, 99),
        "chunk_delay_p50_ms": _pct(samples.chunk_delay_ns, 50),
        "chunk_delay_p99_ms": _pct(samples.chunk_delay_ns, 99),
    }


def _pct(samples_ns: list[int], q: int) -> float:
    """The q-th percentile in milliseconds (NaN when empty)."""
    return round(percentile(samples_ns, q) / 1e6, 3)


def _median_of(rounds: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in rounds), 3)


_ADDED_KEYS = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "total_p50_ms",
    "total_p99_ms",
    "chunk_delay_p50_ms",
    "chunk_delay_p99_ms",
)


# ---- the floor: a byte relay that does nothing but forward


class _RelaySide(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _RelaySide | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def _serve_relay(port: int, upstream_port: int) -> None:
    """A TCP relay (one upstream connection per client connection): what any
    proxy on the router's core costs at least, on this machine, with this
    placement (two wake-ups across cores per chunk)."""
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()

    def accept() -> _RelaySide:
        side = _RelaySide()

        async def connect() -> None:
            _, up = await loop.create_connection(_RelaySide, "127.0.0.1", upstream_port)
            up.peer, side.peer = side, up
            assert up.transport is not None
            for data in side.pending:
                up.transport.write(data)
            side.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return side

    server = await loop.create_server(accept, "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


_SERVE_FLOOR = [sys.executable, "-m", "shoal.bench.router_http", "--serve-floor"]


def _rounds(names: list[str], rounds: int) -> Iterator[list[str]]:
    """Each round runs every target once, starting one later than the round
    before, so no target always runs first (on a cooler or warmer machine)."""
    for i in range(rounds):
        start = i % len(names)
        yield names[start:] + names[:start]


def _wrk_rounds(
    targets: dict[str, int],
    pids: dict[str, int],
    *,
    rounds: int,
    seconds: float,
    connections: int,
    request: Request,
    tmp: Path,
    names: Sequence[str] = ("direct", "router"),
) -> dict[str, list[dict[str, Any]]]:
    """wrk against direct and router (and any other of `targets` named),
    alternated, with every process's CPU."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for order in _rounds(list(runs), rounds):
        for name in order:
            with Meter(pids) as meter:
                run = _wrk(
                    targets[name],
                    seconds=seconds,
                    connections=connections,
                    request=request,
                    tmp=tmp,
                )
            run.update(meter.cpu)
            runs[name].append(run)
    return runs


def _cpu_per_request(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Adds to each wrk run its router's CPU per request, robust to other
    load on the machine (1e6 / this = requests/s on a whole core); direct
    runs get the idle router's, next to nothing."""
    for name, rounds in runs.items():
        cpu_key = "router_cpu" if name in ("direct", "router") else f"{name}_cpu"
        for run in rounds:
            run["router_cpu_us_per_request"] = round(
                float(run[cpu_key]) * 1e6 / run["requests_per_second"], 1
            )


def _medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "rps_median": _median_of(rounds, "requests_per_second"),
        "cpu_us_per_request_median": _median_of(rounds, "router_cpu_us_per_request"),
    }


def _added(prefix: str, runs: dict[str, list[dict[str, Any]]], name: str) -> dict[str, float]:
    """This round's latencies through `name` minus direct."""
    return {
        f"{prefix}_{key}": round(runs[name][-1][key] - runs["direct"][-1][key], 3)
        for key in _ADDED_KEYS
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-relay":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve_relay(int(sys.argv[2]), int(sys.argv[3])))
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-floor":
        serve_floor(FloorServer(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8, help="per wrk throughput phase")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--stream-seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3, help="direct/routed pairs per test")
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-streams", action="store_true")
    parser.add_argument("--wrk-streams", action="store_true", help="also wrk on the stream load")
    parser.add_argument("--router-args", default="", help="extra `shoal router` arguments")
    parser.add_argument(
        "--workload",
        choices=sorted(GENERATORS),
        help="wrk sends this workload's first request (not streamed) instead of a tiny prompt",
    )
    parser.add_argument(
        "--peers",
        default="vllm-router:cache_aware,smg:cache_aware",
        help="peer routers in the throughput rounds, PEER:POLICY or PEER ('' for none)",
    )
    parser.add_argument("--low-connections", type=int, default=4)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also stream through a bare TCP relay on the router's core: the least any "
        "proxy adds with this placement",
    )
    parser.add_argument(
        "--server-floors",
        action="store_true",
        help="also in the throughput rounds: HTTP servers alone on the router's core, "
        "answering without an upstream (aiohttp's, and a bare httptools protocol)",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        raise SystemExit("needs wrk and taskset (apt-get install wrk util-linux)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores: the router on one, load and upstream on the other")
    # This process is the stream load generator: keep it off the router's core.
    os.sched_setaffinity(0, {LOAD_CORE})
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    up_port, router_port, relay_port = free_ports(3)
    peers = expand_peers(args.peers) if not args.skip_throughput else ()
    _run(args, tmp=tmp, ports=(up_port, router_port, relay_port), peer_labels=peers)


def _run(
    args: argparse.Namespace,
    *,
    tmp: Path,
    ports: tuple[int, int, int],
    peer_labels: tuple[str, ...],
) -> None:
    up_port, router_port, relay_port = ports
    upstream_url = f"http://{HOST}:{up_port}"
    relay = [sys.executable, "-m", "shoal.bench.router_http", "--serve-relay"]
    relay_argv = [*relay, str(relay_port), str(up_port)] if args.floor else ["sleep", "infinity"]
    with (
        start(
            [
                *_taskset(LOAD_CORE),
                sys.executable,
                "-m",
                "shoal.bench.instant_upstream",
                "--port",
                str(up_port),
                "--chunks",
                str(args.chunks),
                "--interval",
                str(args.interval),
            ],
            log=tmp / "upstream.log",
            urls=[upstream_url],
        ) as upstream_proc,
        start_router(
            log=tmp / "router.log",
            config={"policy": "cache-aware"},
            endpoints=[upstream_url],
            port=router_port,
            args=args.router_args.split(),
            prefix=_taskset(ROUTER_CORE),
        ) as router_proc,
        start([*_taskset(ROUTER_CORE), *relay_argv], log=tmp / "relay.log") as relay_proc,
        contextlib.ExitStack() as stack,
    ):
        upstream_proc.wait_http("/health", timeout=15)
        router_proc.wait_http("/ready", timeout=15)
        wait_scraped(router_proc.url, [upstream_url])
        if args.floor:
            wait_http(f"http://{HOST}:{relay_port}/health", timeout=15, process=relay_proc)
        # Peers after the upstream answers: vllm-router looks at its
        # workers at start and, finding one down, again only 30 s later.
        peers: dict[str, LocalProcess] = {
            label: stack.enter_context(
                start_peer(
                    parse_peer_policy(label),
                    engines=[upstream_url],
                    log=tmp / f"{label.replace(':', '-')}.log",
                    prefix=_taskset(ROUTER_CORE),
                )
            )
            for label in peer_labels
        }
        for peer in peers.values():
            wait_routing(peer, model="m")
        pids = {
            "router_cpu": router_proc.pid,
            "upstream_cpu": upstream_proc.pid,
            "client_cpu": os.getpid(),
        }
        targets = {"direct": up_port, "router": router_port, "relay": relay_port}
        if args.floor:
            pids["relay_cpu"] = relay_proc.pid
        for label, peer in peers.items():
            targets[label] = int(peer.url.rsplit(":", 1)[1])
            pids[f"{label}_cpu"] = peer.pid
        floors = list(FloorServer) if args.server_floors and not args.skip_throughput else []
        for kind in floors:
            port = free_port()
            served = stack.enter_context(
                start(
                    [*_taskset(ROUTER_CORE), *_SERVE_FLOOR, kind, str(port)],
                    log=tmp / f"{kind}.log",
                    urls=[f"http://{HOST}:{port}"],
                )
            )
            served.wait_http("/health", timeout=15)
            targets[kind], pids[f"{kind}_cpu"] = port, served.pid
        result: dict[str, Any] = {
            "placement": {"router_core": ROUTER_CORE, "load_and_upstream_core": LOAD_CORE},
            "load_average_start": _loadavg(),
        }
        wrk_rounds = functools.partial(_wrk_rounds, targets, pids, rounds=args.rounds, tmp=tmp)
        if not args.skip_throughput:
            request = workload_request(args.workload) if args.workload else _PLAIN
            result["request"] = {"path": request.path, "body_bytes": len(request.body)}
            names = ["direct", "router", *peers, *floors]
            runs = wrk_rounds(
                seconds=args.seconds, connections=args.connections, request=request, names=names
            )
            _cpu_per_request(runs)
            result["throughput"] = {
                "connections": args.connections,
                "direct_rps_median": _median_of(runs["direct"], "requests_per_second"),
                "router_rps_median": _median_of(runs["router"], "requests_per_second"),
                "router_cpu_us_per_request_median": _median_of(
                    runs["router"], "router_cpu_us_per_request"
                ),
                "peers": {label: _medians(runs[label]) for label in peers},
                "server_floors": {kind: _medians(runs[kind]) for kind in floors},
                "rounds": runs,
            }
            low = wrk_rounds(
                seconds=args.seconds,
                connections=args.low_connections,
                request=request,
                names=names,
            )
            _cpu_per_request(low)
            result["latency_low_connections"] = {
                "connections": args.low_connections,
                **{
                    name: {
                        "p50_ms_median": _median_of(low[name], "p50_ms"),
                        "p99_ms_median": _median_of(low[name], "p99_ms"),
                        "rps_median": _median_of(low[name], "requests_per_second"),
                        # A saturated core: latency ~ connections x this.
                        "cpu_us_per_request_median": _median_of(
                            low[name], "router_cpu_us_per_request"
                        ),
                    }
                    for name in names
                },
            }
        if not args.skip_streams:
            names = ["direct", "router", "relay"] if args.floor else ["direct", "router"]
            stream_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            added_runs: list[dict[str, float]] = []
            for order in _rounds(names, args.rounds):
                for name in order:
                    with (
                        Meter(pids) as meter,
                        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
                    ):
                        stats: dict[str, Any] = runner.run(
                            _streams(
                                targets[name],
                                concurrency=args.streams,
                                seconds=args.stream_seconds,
                                warmup=args.warmup,
                            )
                        )
                    stats.update(meter.cpu)
                    # The router's CPU per streamed completion (--chunks + 1 chunks).
                    stats["router_cpu_us_per_stream"] = round(
                        float(stats["router_cpu"]) * 1e6 * args.stream_seconds / stats["requests"],
                        1,
                    )
                    stream_runs[name].append(stats)
                added_runs.append(_added("added", stream_runs, "router"))
                if args.floor:
                    added_runs[-1].update(_added("relay_added", stream_runs, "relay"))
            floor = (
                {
                    f"relay_added_{key}_median": _median_of(added_runs, f"relay_added_{key}")
                    for key in _ADDED_KEYS
                }
                if args.floor
                else {}
            )
            result["streams"] = {
                "concurrency": args.streams,
                "chunks": args.chunks,
                "interval_s": args.interval,
                **{
                    f"added_{key}_median": _median_of(added_runs, f"added_{key}")
                    for key in _ADDED_KEYS
                },
                **floor,
                "router_cpu_us_per_stream_median": _median_of(
                    stream_runs["router"], "router_cpu_us_per_stream"
                ),
                "added_per_round": added_runs,
                "rounds": stream_runs,
            }
        if args.wrk_streams:
            wrk_runs = wrk_rounds(
                seconds=args.stream_seconds, connections=args.streams, request=_STREAM
            )
            result["wrk_streams"] = {
                "added_p50_ms_median": round(
                    _median_of(wrk_runs["router"], "p50_ms")
                    - _median_of(wrk_runs["direct"], "p50_ms"),
                    3,
                ),
                "added_p99_ms_median": round(
                    _median_of(wrk_runs["router"], "p99_ms")
                    - _median_of(wrk_runs["direct"], "p99_ms"),
                    3,
                ),
                "rounds": wrk_runs,
            }
        result["load_average_end"] = _loadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
