"""Start `shoal sim` and `shoal router` processes on loopback for tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from shoal.bench.local import free_ports

MODEL = "m"


def free_port() -> int:
    return free_ports(1)[0]


def wait_http(
    url: str, *, timeout: float = 20.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not answering 200 after {timeout}s")


def start_shoal(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """`shoal ARGS...` with its output appended to log."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", *args], stdout=out, stderr=subprocess.STDOUT
        )


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Engines(list[str]):
    """URLs of running simulated engines, with their processes."""

    def __init__(self, urls: list[str], processes: list[subprocess.Popen[bytes]]) -> None:
        super().__init__(urls)
        self.processes = processes

    def kill(self, index: int) -> None:
        """SIGKILL one engine, as a crash would."""
        self.processes[index].kill()
        self.processes[index].wait()


@contextmanager
def sims(
    count: int, tmp: Path, *, extra: Sequence[str] = (), time_scale: float = 20.0
) -> Iterator[Engines]:
    """`count` simulated engines, one process each (so one can be killed)."""
    processes, urls = [], []
    try:
        for i in range(count):
            port = free_port()
            processes.append(
                start_shoal(
                    [
                        "sim",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--served-model-name",
                        MODEL,
                        "--sim-time-scale",
                        str(time_scale),
                        "--sim-fault-api",
                        *extra,
                    ],
                    tmp / f"sim-{i}.log",
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            wait_http(url + "/health", process=process)
        yield Engines(urls, processes)
    finally:
        for process in processes:
            stop_process(process)


@contextmanager
def router(
    endpoints: Sequence[str],
    tmp: Path,
    *,
    config: dict[str, Any] | None = None,
    name: str = "router",
) -> Iterator[str]:
    port = free_port()
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config or {}))
    process = start_shoal(
        [
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--config",
            str(path),
            "--endpoints",
            ",".join(endpoints),
            "--log-level",
            "WARNING",
        ],
        tmp / f"{name}.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/ready", process=process)
        yield url
    finally:
        stop_process(process)


def wait_scraped(front: str, engines: Sequence[str], *, timeout: float = 10.0) -> None:
    """Until the router has scraped every engine once and seen it idle: its
    /ready needs no scrape, and an engine it has not scraped yet counts as
    fully loaded (so a test that kills one at once could find it never tried)."""
    idle = [
        f'shoal_router_load_score{{replica="{u.removeprefix("http://")}"}} 0.0' for u in engines
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = httpx.get(front + "/metrics", timeout=5).text
        if all(line in metrics for line in idle):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{front} had not scraped every engine after {timeout}s")


def engine_metric(url: str, name: str) -> float:
    """Sum of a metric's samples at an engine (counts at the simulator, not the router)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def set_fault(url: str, **fault: Any) -> None:
    httpx.post(url + "/_sim/fault", json=fault, timeout=5).raise_for_status()
