"""TTFT while a serving fleet scales from 2 to 3 replicas, warm-up gating on
and off (`make bench-warmup`; issue 7).

On the testbed (one started with `make testbed-up`, or a private one for the
run), with the operator as a local process, as the e2e tests run it. Per mode,
on a fresh VLLMCluster of 2 replicas (simulated engines, H100 profile, time
scale 1: a cold prefill of a tenant's ~2,700-token system prompt costs ~0.14 s,
a warm one a step of ~6 ms):

1. prime: each tenant's system prompt sent once to each engine, so the fleet
   is serving warm, as one that ran for a while is;
2. a steady open-loop workload through the router (streamed completions,
   a random tenant's system prompt and a new question each);
3. `kubectl scale --replicas=3` and go on until the new replica has been Ready
   for `--after` seconds;
4. report, over the requests started from the scale command on: TTFT P50,
   P90, P99 and max; the new replica's share, its TTFT, and the prefix-cache hit
   rate of its first routed requests from its own counters (the last
   /metrics sample before the first of them started and the first sample after
   the last of them ended); how long it was Running before Ready.

Mode "on": warm-up prompts are the tenants' system prompts; "off":
`warmup.enabled: false` (admitted once /health answers). Router policy
round-robin by default (a new replica gets its share at once, the case gating
is for). Prints a table; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleet_bench import FleetBench, testbed_for
from shoal.bench.stats import percentile
from shoal.engine.errors import BadMetrics
from shoal.engine.metrics import parse
from shoal.procs import ready_router, wait_until
from shoal_testbed.cluster import DEFAULT_DIR, Testbed

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
NS_PREFIX = "shoal-wb"
WARMED = "serving.shoal.dev/warmed"
NEW_POD = "bench-r2-0"


# ---- the workload


def system_prompt(tenant: int, chars: int) -> str:
    """A tenant's system prompt, distinct from its first words on."""
    head = f"Tenant {tenant} assistant. "
    words: list[str] = []
    rng = random.Random(tenant)
    while len(head) + sum(len(w) + 1 for w in words) < chars:
        words.append(f"rule{rng.randrange(10**6)} holds")
    return head + " ".join(words)


@dataclass
class Sample:
    start: float  # wall clock
    ttft: float | None  # seconds; None on failure
    end: float
    replica: str
    error: str = ""


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: str, *, max_tokens: int, out: list[Sample]
) -> None:
    """A streamed completion; its TTFT is the first data chunk's arrival."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    start, t0 = time.time(), time.perf_counter()
    ttft: float | None = None
    replica = ""
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            replica = response.headers.get("x-shoal-replica", "")
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:160]
                error = f"{response.status_code} {text}"
                out.append(Sample(start, None, time.time(), replica, error))
                return
            async for line in response.aiter_lines():
                if ttft is None and line.startswith("data: {"):
                    ttft = time.perf_counter() - t0
        out.append(Sample(start, ttft, time.time(), replica))
    except httpx.HTTPError as error:
        out.append(Sample(start, None, time.time(), replica, repr(error)))


class Workload:
    """Open loop: a request every 1/rate seconds (Poisson arrivals), in a thread
    of its own with its own event loop."""

    def __init__(self, url: str, prompts: list[str], rate: float, seed: int) -> None:
        self.url, self.prompts, self.rate = url, prompts, rate
        self.rng = random.Random(seed)
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            n = 0
            next_at = time.perf_counter()
            while not self._stop.is_set():
                prompt = self.rng.choice(self.prompts) + f" Question {n}: how do I scale this?"
                task = asyncio.create_task(
                    one_request(client, self.url, prompt, max_tokens=8, out=self.samples)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
                next_at += self.rng.expovariate(self.rate)
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            if tasks:
                await asyncio.wait(tasks, timeout=60)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


# ---- the new engine's own counters


@dataclass(frozen=True)
class Counters:
    at: float
    requests: float
    queries: float
    hits: float


def read_counters(client: httpx.Client, ip: str) -> Counters | None:
    try:
        snapshot = parse(client.get(f"http://{ip}:8000/metrics").text)
    except (httpx.HTTPError, BadMetrics):
        return None
    return Counters(
        time.time(),
        requests=snapshot.requests,
        queries=snapshot.prefix_queries,
        hits=snapshot.prefix_hits,
    )


# ---- the testbed


class Bench(FleetBench):
    def __init__(self, bed: Testbed, work: Path) -> None:
        super().__init__(bed, work, ns_prefix=NS_PREFIX)

    def pods(self, ns: str) -> dict[str, dict[str, Any]]:
        items = self.get("pods", "-n", ns)["items"]
        return {p["metadata"]["name"]: p for p in items}

    def ready(self, ns: str, replicas: int) -> bool:
        status = self.get("vllmcluster", "bench", "-n", ns).get("status", {})
        return bool(
            status.get("readyReplicas") == replicas and status.get("warmReplicas") == replicas
        )

    def router_url(self, ns: str) -> str | None:
        return ready_router(self.pods(ns).values())


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for found in pod.get("status", {}).get("conditions", []):
        if found.get("type") == kind:
            return dict(found)
    return {}


def manifest(args: argparse.Namespace, warmup: bool, prompts: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": MODEL},
        "image": "vllm/vllm-openai:v0.32.0",
        "replicas": 2,
        "parallelism": {"tensor": 1},
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3"},
        "engine": {
            "maxModelLen": 8192,
            "extraArgs": ["--sim-time-scale", str(args.time_scale)],
        },
        "router": {"policy": args.policy, "replicaHeader": True},
        "warmup": (
            {"prompts": [{"text": p} for p in prompts], "timeoutSeconds": 120}
            if warmup
            else {"enabled": False}
        ),
    }
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": "bench"},
        "spec": spec,
    }


# ---- one run


@dataclass
class Result:
    mode: str
    window: list[Sample] = field(default_factory=list)
    new_replica: list[Sample] = field(default_factory=list)
    unready_running_seconds: float = 0.0
    first_hit_rate: float | None = None
    first_count: int = 0
    early: int = 0  # requests to the new replica before it was Ready
    warmup_message: str = ""


def run(bench: Bench, args: argparse.Namespace, mode: str, prompts: list[str]) -> Result:
    result = Result(mode)
    ns = bench.namespace(mode)
    try:
        payload = yaml.safe_dump(manifest(args, mode == "on", prompts))
        bench.kubectl("apply", "-n", ns, "-f", "-", input_text=payload)
        wait_until(lambda: bench.ready(ns, 2), what="2 replicas warm", timeout=180, interval=0.5)
        url = wait_until(lambda: bench.router_url(ns), what="the router Ready")
        # Prime: the serving fleet holds every tenant's system prompt.
        with httpx.Client(timeout=60) as client:
            for pod in bench.pods(ns).values():
                role = pod["metadata"].get("labels", {}).get("serving.shoal.dev/role")
                if role != "leader":
                    continue
                ip = pod["status"]["podIP"]
                for prompt in prompts:
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
                    client.post(f"http://{ip}:8000/v1/completions", json=body).raise_for_status()
        load = Workload(url, prompts, args.rate, args.seed)
        load.start()
        time.sleep(args.before)
        scaled_at = time.time()
        bench.kubectl("scale", "vllmcluster/bench", "-n", ns, "--replicas=3")
        samples: list[Counters] = []
        running_at = ready_at = None
        with httpx.Client(timeout=2) as client:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                new = bench.pods(ns).get(NEW_POD)
                ip = (new or {}).get("status", {}).get("podIP")
                counters = read_counters(client, ip) if ip else None
                if counters is not None:
                    samples.append(counters)
                if new is not None:
                    if running_at is None and new["status"].get("phase") == "Running":
                        running_at = time.time()
                    if condition(new, "Ready").get("status") == "True":
                        ready_at = time.time()
                        result.warmup_message = condition(new, WARMED).get("message", "")
                        break
                time.sleep(0.1)
            if ready_at is None:
                raise TimeoutError(f"{NEW_POD} not Ready in 180 s")
            # Then its counters as it takes traffic.
            while time.time() < ready_at + args.after:
                counters = read_counters(client, ip) if ip else None
                if counters is not None:
                    samples.append(counters)
                time.sleep(0.1)
        load.stop()
        end = ready_at + args.after
        result.unready_running_seconds = ready_at - (running_at or ready_at)
        result.window = [s for s in load.samples if scaled_at <= s.start <= end]
        result.new_replica = sorted(
            (s for s in result.window if s.replica == NEW_POD), key=lambda s: s.start
        )
        result.early = sum(1 for s in result.new_replica if s.start < ready_at - 1.0)
        first = result.new_replica[: args.first]
        if first:
            before = [c for c in samples if c.at < first[0].start]
            last_end = max(s.end for s in first)
            after = [c for c in samples if c.at > last_end]
            if before and after:
                queries = after[0].queries - before[-1].queries
                if queries > 0:
                    result.first_hit_rate = (after[0].hits - before[-1].hits) / queries
                    result.first_count = int(after[0].requests - before[-1].requests)
        return result
    finally:
        bench.delete(ns)


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(
        f"\nscale 2 -> 3 under {args.rate:g} req/s (Poisson), {args.tenants} tenants with "
        f"~{args.prefix_chars}-character system prompts, policy {args.policy}, sim profile "
        f"h100-llama3-8b at time scale {args.time_scale:g}; window: from `kubectl scale` to "
        f"{args.after:g} s after the new replica was Ready"
    )
    header = (
        f"{'warm-up':8} {'reqs':>5} {'fail':>4} {'P50 ms':>7} {'P90 ms':>7} {'P99 ms':>7} "
        f"{'max ms':>7} {'old P99':>7} {'new reqs':>8} {'new P99':>8} {'new max':>8} "
        f"{'first-hit':>9} {'unready s':>9}"
    )
    print(header)
    for r in results:
        ttfts = [s.ttft * 1000 for s in r.window if s.ttft is not None]
        new = [s.ttft * 1000 for s in r.new_replica if s.ttft is not None]
        old = [s.ttft * 1000 for s in r.window if s.ttft is not None and s.replica != NEW_POD]
        fails = sum(1 for s in r.window if s.ttft is None)
        hit = "n/a" if r.first_hit_rate is None else f"{r.first_hit_rate:.2f}"
        print(
            f"{r.mode:8} {len(r.window):5d} {fails:4d} {percentile(ttfts, 50):7.1f} "
            f"{percentile(ttfts, 90):7.1f} {percentile(ttfts, 99):7.1f} "
            f"{max(ttfts, default=0):7.1f} "
            f"{percentile(old, 99):7.1f} "
            f"{len(new):8d} {percentile(new, 99):8.1f} {max(new, default=0):8.1f} {hit:>9} "
            f"{r.unready_running_seconds:9.1f}"
        )
    for r in results:
        first = [round((s.ttft or 0) * 1000, 1) for s in r.new_replica[: args.first]]
        print(f"\n{r.mode}: new replica's first {len(first)} TTFTs (ms): {first}")
        print(f"{r.mode}: its first-requests hit rate counts {r.first_count} requests")
        if r.early:
            print(f"{r.mode}: {r.early} requests reached it over 1 s before it was Ready")
        if r.warmup_message:
            print(f"{r.mode}: gate message: {r.warmup_message}")
    load1, load5, load15 = os.getloadavg()
    cpus = os.cpu_count()
    print(f"\nload average at the end: {load1:.2f} {load5:.2f} {load15:.2f} ({cpus} CPUs)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="testbed state directory")
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second")
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--prefix-chars", type=int, default=12000)
    parser.add_argument("--policy", default="round-robin")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--before", type=float, default=10.0, help="load seconds before scaling")
    parser.add_argument("--after", type=float, default=30.0, help="seconds after Ready")
    parser.add_argument("--first", type=int, default=16, help="new replica's first N requests")
    parser.add_argument("--modes", default="on,off")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode, interleaved")
    parser.add_argument("--save", type=Path, help="write every request's sample here (JSON)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="warmup-bench-"))
    prompts = [system_prompt(t, args.prefix_chars) for t in range(args.tenants)]
    results = []
    with testbed_for(args.dir, work) as bed:
        bench = Bench(bed, work)
        try:
            bench.start_operator()
            for repeat in range(args.repeat):
                for mode in args.modes.split(","):
                    print(f"run {repeat + 1} with warm-up {mode} ...", flush=True)
                    results.append(run(bench, args, mode, prompts))
        finally:
            bench.stop_operator()
    report(results, args)
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(
            json.dumps([{"mode": r.mode, "window": [asdict(s) for s in r.window]} for r in results])
        )
    print(f"logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
