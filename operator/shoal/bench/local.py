"""A fleet on loopback: N simulated engines (one `shoal sim` process serving
them all, the cheapest way on a small machine) and K routers in front: `shoal
router`s, or a peer router (vllm-router, smg: see `peers.py`) for a policy
named "PEER:POLICY". K > 1 stands for several router pods behind one Service;
the load driver splits requests among them at random.

Every start is fresh: cold prefix caches, the same profile and seed, so
policies compared one after another start from the same state. The
processes are shoal.procs': they die with this process even when it is
killed outright, and leaving the context stops them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.bench.peers import is_peer, parse_peer_policy, start_peer, wait_routing
from shoal.procs import HOST, LocalProcess, free_ports, start_router, start_sim, wait_scraped

# How long a fleet's simulator and each router may take to answer.
STARTUP_SECONDS = 90.0


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
    traffic to `fleet.routers` (`fleet.router` is the first); engines' own
    URLs are `fleet.engines`. `router_flags` is what the router was started
    with beyond where it listens and what it routes to."""

    spec: FleetSpec
    policy: str
    workdir: Path
    router_config: dict[str, Any] = field(default_factory=dict)
    router_replicas: int = 1
    engines: list[str] = field(default_factory=list)
    routers: list[str] = field(default_factory=list)
    router_flags: list[str] = field(default_factory=list)
    _processes: list[LocalProcess] = field(default_factory=list)
    _internal_ports: list[int] = field(default_factory=list)

    @property
    def router(self) -> str:
        return self.routers[0]

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
        engine_ports = free_ports(self.spec.replicas)
        sim = start_sim(
            self.spec.sim_flags(),
            log=self.workdir / "sim.log",
            listen=[f"{HOST}:{port}" for port in engine_ports],
        )
        self._processes.append(sim)
        self.engines = list(sim.urls)
        sim.wait_http("/health", timeout=STARTUP_SECONDS)
        # Each shoal router's internal port, where its peers read its placements.
        self._internal_ports = free_ports(self.router_replicas)
        started = [self._start_router(i) for i in range(self.router_replicas)]
        for router in started:
            self._wait_router(router)
        self.routers = [router.url for router in started]

    def _start_router(self, index: int) -> LocalProcess:
        name = self.policy.replace(":", "-") + (f"-{index}" if self.router_replicas > 1 else "")
        log = self.workdir / f"router-{name}.log"
        if is_peer(self.policy):
            peer = parse_peer_policy(self.policy)
            self.router_flags = peer.flags()
            process = start_peer(peer, engines=self.engines, log=log)
        else:
            self.router_flags = ["--config", "router.json (the operator's, see router_config)"]
            config: dict[str, Any] = {
                **self.router_config,
                "policy": self.policy,
                "replicaHeader": True,
            }
            args: list[str] = []
            if self.router_replicas > 1:
                # As the operator deploys them: each reads the others' placements.
                config["internalPort"] = self._internal_ports[index]
                peers = [p for i, p in enumerate(self._internal_ports) if i != index]
                args = ["--peers", ",".join(f"http://{HOST}:{port}" for port in peers)]
                self.router_flags += ["--peers", "(the other routers' internal ports)"]
            process = start_router(log=log, config=config, endpoints=self.engines, args=args)
        self._processes.append(process)
        return process

    def _wait_router(self, router: LocalProcess) -> None:
        if not is_peer(self.policy):
            # A benchmark's deadline, not a measure: on a loaded machine a
            # router's imports alone took 30 s of wall time.
            router.wait_http("/ready", timeout=STARTUP_SECONDS)
            # Routing on load needs the first scrape of every engine to have landed.
            wait_scraped(router.url, self.engines, timeout=30)
            return
        wait_routing(router, model=self.spec.model)

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]
