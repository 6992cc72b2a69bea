"""`shoal sim` and `shoal router` processes on loopback for the integration
tests, on shoal.procs (which starts, waits for and stops them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from shoal.procs import (
    HOST,
    LocalProcess,
    free_port,
    start_router,
    start_sim,
    wait_http,
    wait_scraped,
)

__all__ = [
    "MODEL",
    "Engines",
    "engine_metric",
    "free_port",
    "router",
    "set_fault",
    "sims",
    "wait_http",
    "wait_scraped",
]

MODEL = "m"


class Engines(list[str]):
    """URLs of running simulated engines, with their processes."""

    def __init__(self, processes: list[LocalProcess]) -> None:
        super().__init__(p.url for p in processes)
        self.processes = processes

    def kill(self, index: int) -> None:
        """SIGKILL one engine, as a crash would."""
        self.processes[index].kill()


@contextmanager
def sims(
    count: int, tmp: Path, *, extra: Sequence[str] = (), time_scale: float = 20.0
) -> Iterator[Engines]:
    """`count` simulated engines, one process each (so one can be killed)."""
    args = ["--served-model-name", MODEL, "--sim-time-scale", str(time_scale), "--sim-fault-api"]
    with ExitStack() as stack:
        processes = [
            stack.enter_context(
                start_sim(
                    [*args, *extra], log=tmp / f"sim-{i}.log", listen=[f"{HOST}:{free_port()}"]
                )
            )
            for i in range(count)
        ]
        for process in processes:
            process.wait_http("/health", timeout=20)
        yield Engines(processes)


@contextmanager
def router(
    endpoints: Sequence[str],
    tmp: Path,
    *,
    config: dict[str, Any] | None = None,
    name: str = "router",
    args: Sequence[str] = (),
) -> Iterator[str]:
    """A router over endpoints on router.json `config` (its defaults, but for
    replicaHeader on: tests count placements by it), once it is Ready."""
    config = {"replicaHeader": True, **(config or {})}
    log = tmp / f"{name}.log"
    with start_router(log=log, config=config, endpoints=endpoints, args=args) as front:
        front.wait_http("/ready", timeout=20)
        yield front.url


def engine_metric(url: str, name: str) -> float:
    """Sum of a metric's samples at an engine (counts at the simulator, not the router)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def set_fault(url: str, **fault: Any) -> None:
    httpx.post(url + "/_sim/fault", json=fault, timeout=5).raise_for_status()
