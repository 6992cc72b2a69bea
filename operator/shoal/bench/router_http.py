"""Router throughput and added latency, over real sockets on loopback.

- Throughput: wrk drives small non-streamed completions at the router (pinned
  to core 0 with taskset) and, in the same run, directly at the instant
  upstream (wrk and the upstream on core 1). Target: >= 2,500 requests/s.
- Added latency: 256 concurrent streams through the router and directly,
  time to first chunk and to the end. Target: p50 <= 1 ms, p99 <= 3 ms more
  than direct.
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "m", "prompt": "Say hello to the router benchmark.", "max_tokens": 1}'
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


@contextmanager
def _process(argv: list[str], *, core: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["taskset", "-c", str(core), *argv], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=15)


def _wrk(url: str, *, seconds: int, connections: int, script: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t",
            "1",
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "--latency",
            "-s",
            str(script),
            url + "/v1/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if rps is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return {
        "requests_per_second": float(rps.group(1)),
        "non_2xx": float(errors.group(1)) if errors else 0.0,
    }


async def _streams(url: str, *, concurrency: int, seconds: float) -> dict[str, float]:
    """A closed loop: `concurrency` clients, each streaming one completion after
    another, starts staggered over the first second (steady state, not one
    synchronised burst)."""
    body = {"model": "m", "prompt": "stream please", "max_tokens": 16, "stream": True}
    first: list[float] = []
    total: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(index: int) -> None:
            await asyncio.sleep(index / concurrency)
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with session.post(url + "/v1/completions", json=body) as response:
                    got_first = False
                    async for _ in response.content.iter_any():
                        if not got_first:
                            first.append(time.perf_counter() - started)
                            got_first = True
                total.append(time.perf_counter() - started)

        await asyncio.gather(*(client(i) for i in range(concurrency)))
    return {
        "requests": len(total),
        "ttft_p50_ms": _ms(statistics.median(first)),
        "ttft_p99_ms": _ms(statistics.quantiles(first, n=100)[98]),
        "total_p50_ms": _ms(statistics.median(total)),
        "total_p99_ms": _ms(statistics.quantiles(total, n=100)[98]),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--stream-seconds", type=float, default=10.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        raise SystemExit("needs wrk and taskset (apt-get install wrk util-linux)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores: the router on one, load and upstream on the other")
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    script = tmp / "post.lua"
    script.write_text(_LUA)
    up_port, router_port = _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    router = f"http://127.0.0.1:{router_port}"
    python = sys.executable
    with (
        _process(
            [python, "-m", "shoal.bench.instant_upstream", "--port", str(up_port)],
            core=1,
            log=tmp / "upstream.log",
        ),
        _process(
            [
                python,
                "-m",
                "shoal.cli",
                "router",
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--endpoints",
                upstream,
                "--policy",
                "cache-aware",
                "--log-level",
                "WARNING",
            ],
            core=0,
            log=tmp / "router.log",
        ),
    ):
        _wait(upstream)
        _wait(router)
        time.sleep(1.0)  # let the first scrapes land
        result: dict[str, object] = {
            "throughput": {
                "direct": _wrk(
                    upstream, seconds=args.seconds, connections=args.connections, script=script
                ),
                "router": _wrk(
                    router, seconds=args.seconds, connections=args.connections, script=script
                ),
            },
        }
        direct = asyncio.run(
            _streams(upstream, concurrency=args.streams, seconds=args.stream_seconds)
        )
        routed = asyncio.run(
            _streams(router, concurrency=args.streams, seconds=args.stream_seconds)
        )
        added = {
            f"added_{key}": round(routed[key] - direct[key], 3)
            for key in ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")
        }
        result["streams"] = {
            "concurrency": args.streams,
            "direct": direct,
            "router": routed,
            **added,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
