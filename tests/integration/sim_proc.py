"""Start `shoal sim` processes on loopback for the integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.integration.procs import free_ports, start_shoal, stop_process, wait_http

__all__ = ["TINY_ARGS", "SimProcess", "free_ports", "sim"]

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


class SimProcess:
    """One `shoal sim` process (which may serve many engines), its log kept."""

    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.log = log
        self.proc = start_shoal(["sim", *args], log)

    def wait_healthy(self, url: str, timeout: float = 20.0) -> None:
        try:
            wait_http(f"{url}/health", timeout=timeout, process=self.proc)
        except (RuntimeError, TimeoutError) as error:
            raise AssertionError(f"{error}: {self.log.read_text()}") from error

    def stop(self) -> None:
        stop_process(self.proc)


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
