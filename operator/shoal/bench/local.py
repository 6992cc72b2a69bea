"""A fleet on loopback: N simulated engines (one `shoal sim` process serving
them all, the cheapest way on a small machine) and a `shoal router` in front.

Every start is fresh: cold prefix caches, the same profile and seed, so
policies compared one after another start from the same state. The
processes are shoal.procs': they die with this process even when it is
killed outright, and leaving the context stops them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.procs import HOST, LocalProcess, free_ports, start_router, start_sim, wait_scraped


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
    _processes: list[LocalProcess] = field(default_factory=list)

    def __enter__(self) -> LocalFleet:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        *engine_ports, router_port = free_ports(self.spec.replicas + 1)
        sim = start_sim(
            self.spec.sim_flags(),
            log=self.workdir / "sim.log",
            listen=[f"{HOST}:{port}" for port in engine_ports],
        )
        self._processes.append(sim)
        self.engines = list(sim.urls)
        sim.wait_http("/health")
        router = start_router(
            log=self.workdir / f"router-{self.policy}.log",
            config={**self.router_config, "policy": self.policy},
            endpoints=self.engines,
            port=router_port,
        )
        self._processes.append(router)
        self.router = router.url
        router.wait_http("/ready")
        # Routing on load needs the first scrape of every engine to have landed.
        wait_scraped(self.router, self.engines, timeout=30)

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]
