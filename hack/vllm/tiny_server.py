"""Real vLLM serving the tiny model with the fixtures' flags, for the
recording scripts (record_api.py, record_auth.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shoal.procs import HOST, free_port, start, wait_http

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.integration.sim_proc import SERVE_ARGS  # noqa: E402


@contextlib.contextmanager
def tiny_vllm(vllm_python: str, *, env: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """The server's base URL and its log, `env` added to this process's."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        subprocess.run(
            [vllm_python, str(REPO / "hack" / "vllm" / "make_tiny_model.py"), str(model)],
            check=True,
            capture_output=True,
        )
        port = free_port()
        offline = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        cmd += ["--host", HOST, "--port", str(port), *SERVE_ARGS]
        log = Path(tmp) / "vllm.log"
        base = f"http://{HOST}:{port}"
        with start(
            cmd,
            log=log,
            name="vllm",
            env={**os.environ, **offline, **env},
            new_session=True,
            grace=30.0,
        ) as server:
            wait_http(f"{base}/health", timeout=600, process=server)
            yield base, log
