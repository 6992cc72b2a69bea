"""32 independent engines in one `shoal sim` process (their cost is measured
by hack/sim_fleet_bench.py, not here)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.integration.sim_proc import TINY_ARGS, SimProcess, free_ports
from tests.sim_fixtures import parse_exposition, value


def test_32_engines_serve_independently_from_one_process(tmp_path: Path) -> None:
    ports = free_ports(32)
    listen = [arg for port in ports for arg in ("--sim-listen", f"127.0.0.1:{port}")]
    process = SimProcess([*listen, *TINY_ARGS, "--sim-time-scale", "10"], tmp_path / "fleet.log")
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url in urls:
            process.wait_healthy(url)

        async def drive() -> list[float]:
            async with httpx.AsyncClient(timeout=60) as client:
                # Engine i gets i + 1 prompt tokens, so each one's counters are its own.
                await asyncio.gather(
                    *(
                        client.post(
                            f"{url}/v1/completions",
                            json={"model": "tiny", "prompt": [20] * (i + 1), "max_tokens": 5},
                        )
                        for i, url in enumerate(urls)
                    )
                )
                pages = await asyncio.gather(*(client.get(f"{url}/metrics") for url in urls))
            return [
                value(parse_exposition(page.text)[1], "vllm:prompt_tokens_total") for page in pages
            ]

        assert asyncio.run(drive()) == [float(i + 1) for i in range(32)]
        assert process.proc.poll() is None
    finally:
        process.stop()
