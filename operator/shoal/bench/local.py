"""A fleet on loopback: N simulated engines (one `shoal sim` process serving
them all, the cheapest way on a small machine) and a `shoal router` in front.

Every start is fresh: cold prefix caches, the same profile and seed, so
policies compared one after another start from the same state. Children die
with this process even when it is killed outright (PR_SET_PDEATHSIG), and
leaving the context stops them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, kw_only=True)
class FleetSpec:
    replicas: int
    profile: str = "h100-llama3-8b"
    time_scale: float = 1.0
    seed: int = 0
    model: str = "shoal-sim"
    # KV blocks per engine instead of the profile's (a smaller GPU, or a
    # bigger model on the same one): --num-gpu-blocks-override.
    kv_blocks: int | None = None
    sim_args: tuple[str, ...] = ()  # more `shoal sim` flags (faults)

    def describe(self) -> dict[str, object]:
        return {
            "replicas": self.replicas,
            "profile": self.profile,
            "time_scale": self.time_scale,
            "seed": self.seed,
            "model": self.model,
            "kv_blocks": self.kv_blocks,
            "sim_args": list(self.sim_args),
        }

    def sim_flags(self) -> list[str]:
        flags = [
            "--served-model-name",
            self.model,
            "--sim-profile",
            self.profile,
            "--sim-time-scale",
            str(self.time_scale),
            "--seed",
            str(self.seed),
        ]
        if self.kv_blocks is not None:
            flags += ["--num-gpu-blocks-override", str(self.kv_blocks)]
        return flags + list(self.sim_args)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _get(url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode()) if response.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class LocalFleet:
    """`with LocalFleet(spec, policy=..., workdir=...) as fleet:` then send
    traffic to `fleet.router`; engines' own URLs are `fleet.engines`."""

    spec: FleetSpec
    policy: str
    workdir: Path
    router_config: dict[str, Any] = field(default_factory=dict)
    engines: list[str] = field(default_factory=list)
    router: str = ""
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> LocalFleet:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        *engine_ports, router_port = free_ports(self.spec.replicas + 1)
        listen = [a for p in engine_ports for a in ("--sim-listen", f"127.0.0.1:{p}")]
        sim = self._spawn(
            ["sim", *self.spec.sim_flags(), *listen],
            "sim",
        )
        self.engines = [f"http://127.0.0.1:{p}" for p in engine_ports]
        for url in self.engines:
            self._wait(url + "/health", sim)
        config = self.workdir / f"router-{self.policy}.json"
        config.write_text(json.dumps({**self.router_config, "policy": self.policy}))
        router = self._spawn(
            [
                "router",
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--config",
                str(config),
                "--endpoints",
                ",".join(self.engines),
                "--log-level",
                "WARNING",
            ],
            "router",
        )
        self.router = f"http://127.0.0.1:{router_port}"
        self._wait(self.router + "/ready", router)
        # Routing on load needs the first scrape of every engine to have landed.
        self._wait(
            self.router + "/metrics",
            router,
            until=lambda text: text.count("shoal_router_load_score{") >= self.spec.replicas,
        )

    def _spawn(self, args: Sequence[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "shoal.cli", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self._processes.append(process)
        return process

    def _wait(
        self,
        url: str,
        process: subprocess.Popen[bytes],
        *,
        timeout: float = 30.0,
        until: Any = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{process.args!r} exited with {process.returncode}; see {self.workdir}"
                )
            text = _get(url)
            if text is not None and (until is None or until(text)):
                return
            time.sleep(0.1)
        raise TimeoutError(f"{url} not ready after {timeout:.0f} s; see {self.workdir}")

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self._processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]
