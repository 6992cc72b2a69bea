"""Start `shoal sim` processes on loopback for the integration tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

# The fixtures' server, as a pod would start it.
TINY_ARGS = (
    "--model",
    "/models/tiny",
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
    "--sim-profile",
    "tiny-cpu",
)


def free_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1 (held together so they differ)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


class SimProcess:
    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.log = log
        self._log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "sim", *args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self, url: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"shoal sim exited: {self.log.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{url} not healthy after {timeout}s: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@contextlib.contextmanager
def sim(
    tmp_path: Path, *extra: str, port: int | None = None, wait: bool = True
) -> Iterator[tuple[SimProcess, str]]:
    """One `shoal sim` engine on 127.0.0.1 with the fixtures' flags."""
    port = port or free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    process = SimProcess(
        ["--host", "127.0.0.1", "--port", str(port), *TINY_ARGS, *extra],
        tmp_path / f"sim-{port}.log",
    )
    try:
        if wait:
            process.wait_healthy(url)
        yield process, url
    finally:
        process.stop()
