"""The router when its control-plane reads are slow: engines whose /metrics
take longer than the scrape deadline, and a router whose own event loop runs
late (a CPU-starved pod). Contention is simulated, not waited for: the sim's
`metrics_seconds` fault makes each /metrics render hold the engine's event
loop (as a CPU-starved vLLM's exposition holds its API server's), and
SIGSTOP / SIGCONT make the router's loop late.

- engines whose metrics render slower than the deadline keep serving through
  two routers: the scrapes do not pile up on them and take their time;
- a router whose own loop ran late does not count its lateness against the
  engines: no scrape failure, no warning.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from shoal.procs import HOST, free_ports, start_router, start_sim
from tests.integration.procs import MODEL, set_fault, sims


def completion(prompt: str) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 4}


def scrape_failures(front: str) -> float:
    text = httpx.get(front + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("shoal_router_scrape_failures_total{")
    )


def test_engines_whose_metrics_render_slower_than_the_scrape_deadline_keep_serving(
    tmp_path: Path,
) -> None:
    # Two engines in one process (as `shoal bench` runs them: one event loop
    # renders both expositions), each render holding it 0.3 s, past the
    # 0.2 s deadline of the default 250 ms scrape interval; two routers.
    listen = [f"{HOST}:{port}" for port in free_ports(2)]
    args = ["--served-model-name", MODEL, "--sim-time-scale", "20", "--sim-fault-api"]
    with start_sim(args, log=tmp_path / "sim.log", listen=listen) as sim:
        sim.wait_http("/health", timeout=60)
        for url in sim.urls:
            set_fault(url, metrics_seconds=0.3)
        routers = [
            start_router(
                log=tmp_path / f"router-{i}.log",
                config={"replicaHeader": True},
                endpoints=list(sim.urls),
            )
            for i in range(2)
        ]
        try:
            for front in routers:
                front.wait_http("/ready", timeout=60)
            time.sleep(3.0)  # the routers scrape for a while, as in a long run
            with httpx.Client(timeout=10) as client, ThreadPoolExecutor(8) as pool:

                def send(i: int) -> tuple[int, str]:
                    front = routers[i % 2].url
                    try:
                        answer = client.post(
                            front + "/v1/completions", json=completion(f"question {i}")
                        )
                    except httpx.TimeoutException:
                        return 0, "no answer within 10 s"
                    return answer.status_code, answer.headers.get("x-shoal-replica", "")

                # Cold prompts go by rendezvous: with 8 of them, all on one engine
                # 1 run in 128 (seen once in CI); with 24, 1 in 8 million.
                answers = list(pool.map(send, range(24)))
        finally:
            for front in routers:
                front.stop()
    assert [status for status, _ in answers] == [200] * 24, answers
    served = {replica for _, replica in answers}
    assert served == {url.removeprefix("http://") for url in sim.urls}, served


def test_a_router_whose_own_loop_runs_late_does_not_blame_the_engines(tmp_path: Path) -> None:
    # A 2 s scrape interval (1.6 s deadline); each render takes 0.5 s, so a
    # scrape is out about 25% of the time (twelve stops: one lands in a
    # scrape but for 3% of runs), and each stop of the router lasts past
    # twice the deadline: an answer waits in the socket meanwhile. A render
    # of 0.8 s left a starved engine too little margin for an ordinary scrape.
    config = {"replicaHeader": True, "scrapeIntervalMilliseconds": 2000}
    with sims(1, tmp_path) as engines:
        set_fault(engines[0], metrics_seconds=0.5)
        with start_router(
            log=tmp_path / "router.log", config=config, endpoints=list(engines)
        ) as front:
            front.wait_http("/ready", timeout=60)
            before = scrape_failures(front.url)
            logged = (tmp_path / "router.log").read_text()
            for pause in (0.0, 0.5, 1.0, 1.5, 0.25, 0.75, 1.25, 1.75, 0.1, 0.6, 1.1, 1.6):
                time.sleep(pause)  # a different phase of the scrape each time
                os.kill(front.pid, signal.SIGSTOP)
                time.sleep(3.5)
                os.kill(front.pid, signal.SIGCONT)
            time.sleep(2.5)  # a round after the last stop
            after = scrape_failures(front.url)
            answer = httpx.post(front.url + "/v1/completions", json=completion("q"), timeout=20)
    assert answer.status_code == 200, answer.text
    # Only what was logged while the router was being stopped and resumed.
    log = (tmp_path / "router.log").read_text().removeprefix(logged)
    assert after == before, log
    assert "WARNING" not in log, log
