"""What 32 simulated engines in one `shoal sim` process cost on this machine.

    .venv/bin/python hack/sim_fleet_bench.py [--engines 32] [--streams 2] [--seconds 20]

Starts one `shoal sim` process serving N engines (h100-llama3-8b profile, time
scale 1, as benchmarks run) on 127.0.0.1, then measures from /proc:

- start-up: seconds until every engine answers /health;
- idle: resident memory and CPU (percent of one core) over a quiet interval;
- load: every engine serving `--streams` concurrent streamed completions
  (128 prompt, 256 output tokens, back to back) for `--seconds`: the
  process's CPU and memory; output tokens per second (from the engines'
  own vllm:generation_tokens_total) against what the step model promises
  (a decode step of S sequences takes 6 + 0.08 S ms); the engines' mean
  inter-token latency (vllm:inter_token_latency_seconds) against the model's
  step time, which shows whether the event loop keeps up; and the
  client-side time per output token.

The load generator runs in this process, so it is not counted in the
simulator's CPU (but it shares the 2 cores). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from shoal.procs import HOST, free_ports, start_sim

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def stream_forever(
    client: httpx.AsyncClient, url: str, stop_at: float, tpots: list[float]
) -> None:
    body = {
        "model": "sim",
        "prompt": list(range(1000, 1128)),
        "max_tokens": 256,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    while time.monotonic() < stop_at:
        first = last = 0.0
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith('data: {"id"') and '"choices":[]' not in line:
                    last = time.perf_counter()
                    first = first or last
                if time.monotonic() >= stop_at:
                    break
            else:
                tpots.append((last - first) / 255)


async def engine_totals(client: httpx.AsyncClient, urls: list[str]) -> tuple[float, float, float]:
    """Summed generation tokens, ITL sum and ITL count over the engines."""
    totals = [0.0, 0.0, 0.0]
    names = (
        "vllm:generation_tokens_total{",
        "vllm:inter_token_latency_seconds_sum{",
        "vllm:inter_token_latency_seconds_count{",
    )
    for page in await asyncio.gather(*(client.get(f"{url}/metrics") for url in urls)):
        for line in page.text.splitlines():
            for i, name in enumerate(names):
                if line.startswith(name):
                    totals[i] += float(line.rsplit(" ", 1)[1])
    return totals[0], totals[1], totals[2]


async def measure(pid: int, urls: list[str], args: argparse.Namespace) -> dict[str, object]:
    """Idle, then under load: the simulator's CPU and memory, and its engines' pace."""
    report: dict[str, object] = {}
    limits = httpx.Limits(max_connections=args.engines * args.streams + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.sleep(2)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(5)
        report["idle_cpu_percent"] = round(
            100 * (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0), 2
        )
        report["idle_rss_mib"] = round(rss_mib(pid), 1)

        tpots: list[float] = []
        tokens0, itl_sum0, itl_count0 = await engine_totals(client, urls)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        stop_at = t0 + args.seconds
        await asyncio.gather(
            *(
                stream_forever(client, url, stop_at, tpots)
                for url in urls
                for _ in range(args.streams)
            )
        )
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
        tokens, itl_sum, itl_count = await engine_totals(client, urls)
        step_ms = 6 + 0.08 * args.streams
        report["load"] = {
            "streams_per_engine": args.streams,
            "sim_cpu_percent": round(100 * cpu / elapsed, 1),
            "rss_mib": round(rss_mib(pid), 1),
            "output_tokens_per_s": round((tokens - tokens0) / elapsed),
            "model_tokens_per_s": round(args.engines * args.streams * 1000 / step_ms),
            "engine_itl_mean_ms": round(1000 * (itl_sum - itl_sum0) / (itl_count - itl_count0), 2),
            "model_itl_ms": round(step_ms, 2),
            "client_tpot_median_ms": round(statistics.median(tpots) * 1000, 2) if tpots else None,
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=32)
    parser.add_argument("--streams", type=int, default=2, help="concurrent streams per engine")
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()

    log = Path(tempfile.mkdtemp(prefix="sim-fleet-bench-")) / "sim.log"
    listen = [f"{HOST}:{port}" for port in free_ports(args.engines)]
    started = time.monotonic()
    flags = ["--served-model-name", "sim", "--sim-log-level", "WARNING"]
    with start_sim(flags, log=log, listen=listen) as sim:
        sim.wait_http("/health", timeout=120)
        report: dict[str, object] = {
            "engines": args.engines,
            "profile": "h100-llama3-8b",
            "startup_s": round(time.monotonic() - started, 2),
        }
        report.update(asyncio.run(measure(sim.pid, list(sim.urls), args)))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
