"""Time the same workloads on real vLLM 0.32 and on `shoal sim`; fit tiny-cpu.

    .venv/bin/python hack/vllm/compare_timing.py            # starts both servers
    .venv/bin/python hack/vllm/compare_timing.py --real URL --sim URL

With no URLs it installs (or finds) the real-vLLM venv with
hack/vllm/install.sh, builds the tiny model, and starts real vLLM and
`shoal sim --sim-profile tiny-cpu` (time scale 1) with the fixtures' flags
(--max-model-len 2048 --kv-cache-memory-bytes 8M --max-num-seqs 8), one after
the other's run, on loopback. Prompts are token ids (exact lengths, different
per request, so nothing hits the prefix cache) and ignore_eos is set, so both
engines do the same work. Measured from the client over streamed completions:

- decode1 / decode8 / decode8_long: mean inter-token latency as the engine
  itself reports it (vllm:inter_token_latency_seconds, read before and after;
  client-side gaps are useless here, as real vLLM's API server on two busy
  cores sometimes sends a whole stream in one burst) of 1 and of 8 concurrent
  requests of 16 prompt tokens, and of 8 of 1,000 prompt tokens (128 output
  tokens each);
- ttft_N: median TTFT of a lone N-token prompt, N = 100 ... 1,500;
- mixed: 24 requests of 600 prompt / 64 output tokens, 8 at a time: mean
  TTFT and output tokens per second (the ratios the closing note reports).

The fit (printed for the real engine): per decoding sequence =
(decode8 - decode1) / 7, fixed = decode1 - that; per context token =
(decode8_long - decode8) / (8 x 984 more tokens of context); TTFT(N) =
a + b N by least squares over the lone prompts up to 1,000 tokens: per prompt
token = b, frontend = a - fixed (it absorbs the HTTP round trip too). The real engine's
numbers move by up to 2x with other load on the two cores: run it quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
SERVE_ARGS = [
    "--served-model-name",
    "tiny",
    "--max-model-len",
    "2048",
    "--enable-prefix-caching",
    "--kv-cache-memory-bytes",
    "8M",
    "--max-num-seqs",
    "8",
    "--enforce-eager",
]
SWEEP = (100, 300, 600, 1000, 1500)


async def stream_one(
    client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int
) -> tuple[float, float]:
    """(TTFT, time per output token after the first) of one streamed completion."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    tpot = (stamps[-1] - stamps[0]) / (max_tokens - 1) if max_tokens > 1 else 0.0
    return stamps[0] - start, tpot


async def engine_itl(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """The engine's own vllm:inter_token_latency_seconds (sum, count)."""
    text = (await client.get(f"{url}/metrics")).text
    found = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"vllm:inter_token_latency_seconds_{part}{{"):
                found[part] = float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


def prompts(rng: random.Random, count: int, length: int) -> list[list[int]]:
    return [[rng.randrange(3, 1000) for _ in range(length)] for _ in range(count)]


async def measure(url: str, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    out: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=600) as client:
        await stream_one(client, url, prompts(rng, 1, 16)[0], 4)  # warm up
        scenarios = (("decode1", 1, 16), ("decode8", 8, 16), ("decode8_long", 8, 1000))
        for name, count, length in scenarios:
            before = await engine_itl(client, url)
            await asyncio.gather(
                *(stream_one(client, url, p, 128) for p in prompts(rng, count, length))
            )
            after = await engine_itl(client, url)
            out[f"{name}_itl_ms"] = 1000 * (after[0] - before[0]) / (after[1] - before[1])
        for n in SWEEP:
            ttfts = [(await stream_one(client, url, p, 1))[0] for p in prompts(rng, 3, n)]
            out[f"ttft_{n}_ms"] = statistics.median(ttfts) * 1000

        semaphore = asyncio.Semaphore(8)

        async def limited(p: list[int]) -> tuple[float, float]:
            async with semaphore:
                return await stream_one(client, url, p, 64)

        start = time.perf_counter()
        mixed = await asyncio.gather(*(limited(p) for p in prompts(rng, 24, 600)))
        elapsed = time.perf_counter() - start
        out["mixed_ttft_mean_ms"] = statistics.mean(t for t, _ in mixed) * 1000
        out["mixed_output_tok_per_s"] = 24 * 64 / elapsed
    return out


def fit(real: dict[str, float]) -> dict[str, float]:
    per_seq = (real["decode8_itl_ms"] - real["decode1_itl_ms"]) / 7
    fixed = real["decode1_itl_ms"] - per_seq
    per_context = (real["decode8_long_itl_ms"] - real["decode8_itl_ms"]) / (8 * (1000 - 16))
    xs = [n for n in SWEEP if n <= 1000]
    ys = [real[f"ttft_{n}_ms"] for n in xs]
    slope, intercept = statistics.linear_regression(xs, ys)
    return {
        "step_fixed_s": round(fixed / 1000, 5),
        "step_per_decode_seq_s": round(per_seq / 1000, 6),
        "step_per_context_token_s": round(per_context / 1000, 9),
        "step_per_prompt_token_s": round(slope / 1000, 7),
        "frontend_s": round((intercept - fixed) / 1000, 4),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def server(cmd: list[str], port: int, env: dict[str, str]) -> Iterator[str]:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[:3]} exited with {proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def run_both(seed: int) -> tuple[dict[str, float], dict[str, float]]:
    venv = subprocess.run(
        ["bash", str(HERE / "install.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    python = str(Path(venv) / "bin" / "python")
    with tempfile.TemporaryDirectory() as model:
        subprocess.run(
            [python, str(HERE / "make_tiny_model.py"), model], check=True, capture_output=True
        )
        port = free_port()
        real_cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        real_cmd += ["--host", "127.0.0.1", "--port", str(port), *SERVE_ARGS]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        with server(real_cmd, port, env) as url:
            real = asyncio.run(measure(url, seed))
        port = free_port()
        sim_cmd = [sys.executable, "-m", "shoal.cli", "sim", "--model", model, "--host"]
        sim_cmd += ["127.0.0.1", "--port", str(port), *SERVE_ARGS, "--sim-profile", "tiny-cpu"]
        with server(sim_cmd, port, dict(os.environ)) as url:
            sim = asyncio.run(measure(url, seed))
    return real, sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", help="base URL of a running real vLLM")
    parser.add_argument("--sim", help="base URL of a running simulator")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.real or args.sim:
        real = asyncio.run(measure(args.real, args.seed)) if args.real else None
        sim = asyncio.run(measure(args.sim, args.seed)) if args.sim else None
    else:
        real, sim = run_both(args.seed)
    report: dict[str, object] = {"real": real, "sim": sim}
    if real:
        report["fit"] = fit(real)
    if real and sim:
        report["sim_over_real"] = {k: round(sim[k] / real[k], 3) for k in real}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
