"""Peer routers measured beside shoal: vllm-router (the vLLM project's Rust
router) and smg (SGLang's gateway, Shepherd Model Gateway), both from PyPI
with their binaries inside.

Each peer is pinned, and installed into a venv of its own under
~/.cache/shoal/peers-venv/<hash of the pins and Python>, created on first use
(so a fresh machine works and a warm one starts at once), never into shoal's
venv: their dependencies are not shoal's. `PEERS` says how each is started:
documented defaults, with only the flags a local run needs (where to listen,
which engines, the policy, a Prometheus port of its own instead of the shared
default 29000, and warnings-only logs so per-request log lines do not eat the
CPU being measured). Anything beyond that is tuning and is reported as such
in each result's `router_flags`.

The pure part (which peer, which policy, which argv) is apart from the one
I/O function, `peers_venv`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from shoal.procs import HOST, LocalProcess, free_ports, start, wait_until


@dataclass(frozen=True, kw_only=True)
class Peer:
    name: str
    package: str
    version: str
    command: tuple[str, ...]  # the console script and its subcommand
    policies: tuple[str, ...]  # the ones the bench knows how to start
    best: tuple[str, ...]  # what `--peers NAME` runs
    quiet: tuple[str, ...] = ()  # flags that keep per-request logging off

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"


PEERS: dict[str, Peer] = {
    "vllm-router": Peer(
        name="vllm-router",
        package="vllm-router",
        version="0.1.17",
        command=("vllm-router",),
        policies=("cache_aware", "power_of_two", "consistent_hash", "sticky_least_loaded"),
        # consistent_hash and sticky_least_loaded key on a session id (the
        # OpenAI `user` field among others), but 0.1.17 sent every request of
        # the shared-prefix workload to one replica (docs/benchmarks.md): run
        # them by name (vllm-router:consistent_hash), not by default.
        best=("cache_aware", "power_of_two"),
        quiet=("--log-level", "warning"),
    ),
    "smg": Peer(
        name="smg",
        package="smg",
        version="1.13.0",
        command=("smg", "launch"),
        policies=("cache_aware", "power_of_two", "prefix_hash", "least_load", "round_robin"),
        best=("cache_aware", "power_of_two"),
        quiet=("--log-level", "warn"),
    ),
}

SEPARATOR = ":"  # a peer policy is named "PEER:POLICY", e.g. "smg:cache_aware"


@dataclass(frozen=True)
class PeerPolicy:
    peer: Peer
    policy: str

    @property
    def label(self) -> str:
        return f"{self.peer.name}{SEPARATOR}{self.policy}"

    def flags(self) -> list[str]:
        """The flags beside where it listens and which engines it routes to."""
        return ["--policy", self.policy, *self.peer.quiet]

    def argv(
        self, venv: Path, *, port: int, prometheus_port: int, engines: Sequence[str]
    ) -> list[str]:
        script, *sub = self.peer.command
        return [
            str(venv / "bin" / script),
            *sub,
            "--host",
            HOST,
            "--port",
            str(port),
            "--worker-urls",
            *engines,
            "--prometheus-port",
            str(prometheus_port),
            "--prometheus-host",
            HOST,
            *self.flags(),
        ]


def is_peer(name: str) -> bool:
    return SEPARATOR in name


def parse_peer_policy(name: str) -> PeerPolicy:
    peer_name, _, policy = name.partition(SEPARATOR)
    peer = PEERS.get(peer_name)
    if peer is None:
        raise ValueError(f"unknown peer {peer_name!r}; choose from {sorted(PEERS)}")
    if policy not in peer.policies:
        raise ValueError(f"{peer_name} policy {policy!r}: choose from {list(peer.policies)}")
    return PeerPolicy(peer, policy)


def expand_peers(text: str) -> tuple[str, ...]:
    """`--peers vllm-router,smg:prefix_hash` as labels: a bare peer name runs
    its best policies, PEER:POLICY just that one."""
    labels: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if is_peer(item):
            labels.append(parse_peer_policy(item).label)
            continue
        peer = PEERS.get(item)
        if peer is None:
            raise ValueError(f"unknown peer {item!r}; choose from {sorted(PEERS)}")
        labels += [PeerPolicy(peer, policy).label for policy in peer.best]
    return tuple(dict.fromkeys(labels))


def pins_key(peers: Sequence[Peer] = tuple(PEERS.values())) -> str:
    """What the cached venv is keyed by: the pins and the Python it runs on."""
    text = "\n".join(sorted(p.pin for p in peers)) + f"\npython {sys.version_info[:2]}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    """SHOAL_CACHE, as hack/'s build scripts read it (a cold CI run sets it)."""
    if found := os.environ.get("SHOAL_CACHE"):
        return Path(found)
    return Path.home() / ".cache" / "shoal"


def peers_venv(*, log: Path | None = None) -> Path:
    """The venv holding every pinned peer, installed on first use. A lock
    keeps two benches from installing at once; a marker written last means a
    half-made venv (an interrupted install) is made again, not used."""
    peers = tuple(PEERS.values())
    venv = cache_root() / "peers-venv" / pins_key(peers)
    marker = venv / ".installed"
    if marker.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        # The base interpreter, not shoal's venv's: the peers' venv stands alone.
        base = getattr(sys, "_base_executable", sys.executable)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install"]
        steps = [
            [base, "-m", "venv", str(venv)],
            [*pip, "--disable-pip-version-check", "--quiet", *(p.pin for p in peers)],
        ]
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(log, "ab")) if log is not None else None
            try:
                for step in steps:
                    subprocess.run(step, check=True, stdout=out, stderr=out)
            except subprocess.CalledProcessError as error:
                shutil.rmtree(venv, ignore_errors=True)
                where = f" (see {log})" if log is not None else ""
                raise RuntimeError(f"installing {[p.pin for p in peers]} failed{where}") from error
        marker.write_text("\n".join(p.pin for p in peers) + "\n")
    return venv


def start_peer(
    policy: PeerPolicy,
    *,
    engines: Sequence[str],
    log: Path,
    prefix: Sequence[str] = (),
) -> LocalProcess:
    """The peer router on a free port in front of `engines` (installed first
    if need be); prefix runs it under another command (`taskset -c 0`)."""
    venv = peers_venv(log=log.with_name("peers-install.log"))
    port, prometheus = free_ports(2)
    argv = policy.argv(venv, port=port, prometheus_port=prometheus, engines=engines)
    return start([*prefix, *argv], log=log, name=policy.label, urls=[f"http://{HOST}:{port}"])


def wait_routing(router: LocalProcess, *, model: str, timeout: float = 60.0) -> None:
    """Until the peer routes: its /health answers before its workers are
    registered, so this sends 1-token completions until one is answered
    (taken before a benchmark reads the engines' counters)."""
    body = {"model": model, "prompt": "ping", "max_tokens": 1}

    def routes() -> bool:
        try:
            answer = httpx.post(router.url + "/v1/completions", json=body, timeout=5)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    wait_until(routes, what=f"{router.name} to route", timeout=timeout, process=router)


if __name__ == "__main__":
    # `python -m shoal.bench.peers`: install the pinned peers (cached), print where.
    print(peers_venv())
