"""A day-like load through the operator's autoscaler (`make bench-autoscale`;
issue 21), against a static fleet sized for the peak.

On the testbed (one started with `make testbed-up`, or a private one for the
run), with the operator as a local process, as the e2e tests run it. Each
mode runs the same day (bench/autoscale.py: quiet, ramp, peak, fall, idle,
seeded Poisson arrivals) on a fresh VLLMCluster of simulated engines (H100
profile, slowed to `--time-scale` so a few requests a second load a replica):

- static: `--peak-replicas` replicas all day, warm-up gated;
- warm: autoscaled (minReplicas 0, maxReplicas `--peak-replicas`), starting
  the day on one replica, new replicas warm-up gated on the tenants' system
  prompts;
- cold: the same with warm-up gating off (a replica takes traffic once
  /health answers).

Each request is a tenant's system prompt (shared, cacheable), a part of its
own and a question, streamed (`--output-tokens`). Measured: every request's
TTFT (P99 overall and over the ramps), the leader pods that exist (started,
warming, serving or draining: each holds its GPUs) sampled every half second,
integrated into replica-seconds (the day's length), and, once the idle
autoscaled fleet is at zero replicas, one request's TTFT (from zero). Modes
run interleaved per repeat; the report gives medians and ranges over repeats. Writes bench-results/
autoscale.json, autoscale.md and a plot; nothing here asserts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import ssl
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleet_bench import FleetBench, testbed_for
from shoal.api.spec import RouterSpec
from shoal.bench.autoscale import (
    Phase,
    PhaseName,
    Request,
    arrivals,
    by_mode,
    day,
    following,
    length,
    replica_seconds,
    summarize,
    table_text,
    targets,
    timeline,
)
from shoal.bench.autoscale_plot import plot_day
from shoal.controller.autoscale import parse_router_demand
from shoal.controller.names import COMPONENT_ROUTER, LABEL_COMPONENT, ROUTER_PORT
from shoal.procs import ready_routers, wait_until
from shoal_testbed.cluster import DEFAULT_DIR, REPO, Testbed
from warmup_bench import MODEL, Sample, one_request, system_prompt

NS_PREFIX = "shoal-ab"
NAME = "day"
LEADERS = f"serving.shoal.dev/cluster={NAME},serving.shoal.dev/role=leader"
MODES = ("static", "warm", "cold")


def words(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(f"item{rng.randrange(10**6)}")
    return " ".join(out)


class DayLoad:
    """The day's requests at their offsets (open loop), in a thread with its own
    loop, each to one of the router pods at random, as their Service (no session
    affinity) splits them."""

    def __init__(
        self, urls: list[str], prompts: list[str], offsets: list[float], *, args: Any
    ) -> None:
        self.urls, self.prompts, self.offsets = urls, prompts, offsets
        self.unique_chars, self.seed = args.unique_chars, args.seed
        self.max_tokens = args.output_tokens
        self.samples: list[Sample] = []
        self.started_at = 0.0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        rng = random.Random(f"{self.seed}-prompts")
        split = random.Random(f"{self.seed}-routers")
        tasks: set[asyncio.Task[None]] = set()
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=180, limits=limits) as client:
            t0 = time.perf_counter()
            for n, offset in enumerate(self.offsets):
                await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
                prompt = (
                    rng.choice(self.prompts)
                    + " Context: "
                    + words(rng, self.unique_chars)
                    + f" Question {n}: what changed?"
                )
                task = asyncio.create_task(
                    one_request(
                        client,
                        split.choice(self.urls),
                        prompt,
                        max_tokens=self.max_tokens,
                        out=self.samples,
                    )
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=180)

    def start(self) -> None:
        self.started_at = time.time()
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)


class Bench(FleetBench):
    def __init__(self, bed: Testbed, work: Path) -> None:
        super().__init__(bed, work, ns_prefix=NS_PREFIX)
        assert bed.state is not None
        self.server = bed.state.server
        tls = ssl.create_default_context(cafile=str(bed.pki / "ca.crt"))
        tls.load_cert_chain(str(bed.pki / "admin.crt"), str(bed.pki / "admin.key"))
        self.api = httpx.Client(verify=tls, timeout=5)

    def pods(self, ns: str, selector: str = "") -> list[dict[str, Any]]:
        answer = self.api.get(
            f"{self.server}/api/v1/namespaces/{ns}/pods", params={"labelSelector": selector}
        )
        answer.raise_for_status()
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    def cluster(self, ns: str) -> dict[str, Any]:
        answer = self.api.get(
            f"{self.server}/apis/serving.shoal.dev/v1alpha1/namespaces/{ns}/vllmclusters/{NAME}"
        )
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found

    def demand(self, ns: str) -> float | None:
        """What the autoscaler reads, read at once: requests in flight plus
        queued over the router pods that answer (None: none did)."""
        found: list[float] = []
        for pod in self.pods(ns, f"{LABEL_COMPONENT}={COMPONENT_ROUTER}"):
            ip = pod.get("status", {}).get("podIP")
            if not ip:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = self.api.get(f"http://{ip}:{ROUTER_PORT}/metrics", timeout=2)
                scraped = parse_router_demand(answer.text)
                found.append(scraped.in_flight + scraped.queued)
        return sum(found) if found else None

    def leaders(self, ns: str) -> int:
        """Leader pods that hold their GPUs: not yet gone, nor finished."""
        pods = self.pods(ns, LEADERS)
        return sum(
            1 for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        )


def manifest(args: argparse.Namespace, mode: str, prompts: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": MODEL},
        "image": "vllm/vllm-openai:v0.32.0",
        # The autoscaled fleets start the day as a quiet one runs: on one replica.
        "replicas": args.peak_replicas if mode == "static" else 1,
        "parallelism": {"tensor": 1},
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": 8192, "extraArgs": ["--sim-time-scale", str(args.time_scale)]},
        "router": {"replicaHeader": True, "queue": {"zeroReplicaWaitSeconds": 120}},
        # The shared machine is loaded: an engine slow to answer is not restarted
        # (in every mode alike), so the run measures scaling, not self-healing.
        "health": {"failureThreshold": 20, "routerErrors": {"enabled": False}},
        "warmup": (
            {"enabled": False}
            if mode == "cold"
            else {"prompts": [{"text": p} for p in prompts], "timeoutSeconds": 120}
        ),
    }
    if mode != "static":
        # minReplicas 1 until the day starts (an idle fleet would go to zero
        # while it is set up), then 0.
        spec["autoscaling"] = {
            "minReplicas": 1,
            "maxReplicas": args.peak_replicas,
            "targetPerReplica": args.target,
            "scaleUpStabilizationSeconds": args.up_window,
            "scaleDownStabilizationSeconds": args.down_window,
            "idleSeconds": args.idle_seconds,
        }
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": NAME},
        "spec": spec,
    }


def run(
    bench: Bench,
    args: argparse.Namespace,
    mode: str,
    *,
    phases: list[Phase],
    offsets: list[float],
    prompts: list[str],
) -> dict[str, Any]:
    ns = bench.namespace(mode)
    try:
        payload = yaml.safe_dump(manifest(args, mode, prompts))
        bench.kubectl("apply", "-n", ns, "-f", "-", input_text=payload)
        wanted = args.peak_replicas if mode == "static" else 1

        def settled() -> bool:
            status = bench.cluster(ns).get("status", {})
            return bool(
                status.get("warmReplicas", 0) == wanted
                and status.get("replicas", 0) == wanted
                and bench.leaders(ns) == wanted
            )

        wait_until(settled, what=f"{mode}: {wanted} replicas warm", timeout=300, interval=1)
        routers = found_routers(bench, ns)

        def all_ready() -> list[str] | None:
            ready = ready_routers(bench.pods(ns))
            return ready if len(ready) == routers else None

        urls = wait_until(all_ready, what=f"{mode}: its {routers} routers Ready", timeout=120)
        if mode != "static":
            patch = json.dumps({"spec": {"autoscaling": {"minReplicas": 0}}})
            bench.kubectl("patch", "vllmcluster", NAME, "-n", ns, "--type=merge", "-p", patch)
        load = DayLoad(urls, prompts, offsets, args=args)
        load.start()
        replicas: list[tuple[float, int]] = []
        decisions: list[dict[str, Any]] = []  # the demand, and what the autoscaler asked for
        end = length(phases)
        while (at := time.time() - load.started_at) < end:
            with contextlib.suppress(httpx.HTTPError):
                replicas.append((at, bench.leaders(ns)))
                found = bench.cluster(ns)
                scaler = found.get("status", {}).get("autoscaling") or {}
                decisions.append(
                    {
                        "at": round(at, 2),
                        "spec_replicas": found["spec"].get("replicas"),
                        "demand": bench.demand(ns),
                        "decision": scaler.get("lastDecision"),
                    }
                )
            time.sleep(0.5)
        load.join(timeout=200)
        requests = [Request(sent=s.start - load.started_at, ttft=s.ttft) for s in load.samples]
        errors = sorted({s.error for s in load.samples if s.error})[:5]
        from_zero = None if mode == "static" else wake(bench, ns, urls[0], prompts)
        return {
            "mode": mode,
            "requests": requests,
            "replicas": replicas,
            "decisions": decisions,
            "errors": errors,
            "from_zero": from_zero,
        }
    finally:
        bench.delete(ns)


def found_routers(bench: Bench, ns: str) -> int:
    """Router pods the cluster asks for (spec.router.replicas, defaulted)."""
    spec = bench.cluster(ns)["spec"]
    return int((spec.get("router") or {}).get("replicas", RouterSpec().replicas))


def wake(bench: Bench, ns: str, url: str, prompts: list[str]) -> float | None:
    """Once the idle fleet is at zero replicas, one request: its TTFT
    (seconds; None if the fleet did not reach zero or the request failed)."""
    try:
        wait_until(lambda: bench.leaders(ns) == 0, what="zero replicas", timeout=120, interval=1)
    except TimeoutError:
        return None
    samples: list[Sample] = []

    async def send() -> None:
        async with httpx.AsyncClient(timeout=180) as client:
            await one_request(client, url, prompts[0] + " Wake up.", max_tokens=4, out=samples)

    asyncio.run(send())
    return samples[0].ttft if samples else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="testbed state directory")
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode, interleaved")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quiet-rate", type=float, default=0.15, help="requests/s, quiet")
    parser.add_argument("--peak-rate", type=float, default=0.9, help="requests/s at the peak")
    parser.add_argument(
        "--phases",
        default="60,60,40,60,60",
        help="seconds of quiet, ramp, peak, fall and idle",
    )
    parser.add_argument("--peak-replicas", type=int, default=3)
    # At the peak the static fleet carries 3-5 in flight per replica (requests
    # last ~11 s at this time scale); target 3 kept the autoscaled fleet at its
    # maximum from early in the ramp to late in the fall (run 3). A 4 s up
    # window lets a quiet phase's Poisson burst pass without a replica that
    # would be warm only after it (runs 4 on).
    parser.add_argument("--target", type=int, default=5, help="targetPerReplica (in flight)")
    parser.add_argument("--up-window", type=int, default=4, help="up stabilization s")
    parser.add_argument("--down-window", type=int, default=15, help="down stabilization s")
    # Longer than the quiet phase's gaps between requests (Poisson at 0.15/s:
    # a 10 s gap is common, a 30 s one rare), or the fleet goes to zero then.
    parser.add_argument("--idle-seconds", type=int, default=30)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--prefix-chars", type=int, default=3200, help="system prompt length")
    parser.add_argument("--unique-chars", type=int, default=400, help="each request's own text")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=0.02, help="simulator time scale")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--plot", type=Path, help="the plot (default: OUT/autoscale.png)")
    args = parser.parse_args()

    seconds = [float(s) for s in args.phases.split(",")]
    phases = day(
        quiet_rate=args.quiet_rate,
        peak_rate=args.peak_rate,
        seconds=dict(zip(PhaseName, seconds, strict=True)),
    )
    prompts = [system_prompt(t, args.prefix_chars) for t in range(args.tenants)]
    work = Path(tempfile.mkdtemp(prefix="autoscale-bench-"))
    raw: list[dict[str, Any]] = []
    with testbed_for(args.dir, work) as bed:
        bench = Bench(bed, work)
        try:
            bench.start_operator()
            for repeat in range(args.repeat):
                offsets = arrivals(phases, seed=args.seed + repeat)
                for mode in args.modes.split(","):
                    print(f"repeat {repeat + 1}: {mode} ({len(offsets)} requests) ...", flush=True)
                    found = run(bench, args, mode, phases=phases, offsets=offsets, prompts=prompts)
                    found["repeat"] = repeat
                    raw.append(found)
                    summary = summarize(
                        mode,
                        found["requests"],
                        found["replicas"],
                        phases=phases,
                        from_zero=found["from_zero"],
                    )
                    print(f"  {summary}", flush=True)
                    if found["errors"]:
                        print(f"  errors: {found['errors']}", flush=True)
        finally:
            bench.stop_operator()
    report(args, phases, raw)
    print(f"logs: {work}")
    return 0


def report(args: argparse.Namespace, phases: list[Phase], raw: list[dict[str, Any]]) -> None:
    summaries = [
        summarize(r["mode"], r["requests"], r["replicas"], phases=phases, from_zero=r["from_zero"])
        for r in raw
    ]
    table = by_mode(summaries)
    load1, load5, _ = os.getloadavg()
    lines = [
        f"Day: {args.phases} s of quiet/ramp/peak/fall/idle, {args.quiet_rate:g} -> "
        f"{args.peak_rate:g} req/s (Poisson, seed {args.seed}+repeat), {args.tenants} tenants' "
        f"~{args.prefix_chars}-char system prompts + {args.unique_chars} chars each, "
        f"{args.output_tokens} tokens out, streamed; sim h100-llama3-8b at time scale "
        f"{args.time_scale:g}; autoscaled: "
        f"0..{args.peak_replicas} replicas, target {args.target} in flight, up window "
        f"{args.up_window} s, down window {args.down_window} s, idle {args.idle_seconds} s; "
        f"static: {args.peak_replicas} replicas. {args.repeat} repeat(s); median [range]. "
        f"Load average at the end {load1:.1f} / {load5:.1f} on {os.cpu_count()} CPUs.",
        "",
        table_text(table),
        "",
    ]
    for r in raw:
        if r["mode"] == "static":
            continue
        demand = [(d["at"], d["demand"]) for d in r["decisions"]]
        bound = replica_seconds(
            following(demand, target=args.target, most=args.peak_replicas), end=length(phases)
        )
        lines.append(
            f"- {r['mode']}, repeat {r['repeat'] + 1}: a fleet following its measured demand "
            f"exactly (ceil(demand / {args.target}), no window, start-up or drain) would "
            f"have used {bound:.0f} replica-s"
        )
    modes = set(table)
    if {"static", "warm", "cold"} <= modes:
        for target in targets(table, static="static", warm="warm", cold="cold"):
            verdict = "met" if target.met else "MISSED"
            lines.append(f"- {target.what}: {target.value:.2f} ({target.limit}): {verdict}")
    text = "\n".join(lines)
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "autoscale.md").write_text(text + "\n")
    (args.out / "autoscale.json").write_text(
        json.dumps(
            [
                {
                    "mode": r["mode"],
                    "repeat": r["repeat"],
                    "summary": asdict(s),
                    "errors": r["errors"],
                    "replicas": r["replicas"],
                    "decisions": r["decisions"],
                    "requests": [asdict(q) for q in r["requests"]],
                }
                for r, s in zip(raw, summaries, strict=True)
            ]
        )
    )
    first = {r["mode"]: r for r in raw if r["repeat"] == 0}
    end = length(phases)
    bins = {
        mode: timeline(r["requests"], r["replicas"], end=end, bin_seconds=5.0)
        for mode, r in first.items()
    }
    plot = args.plot or args.out / "autoscale.png"
    plot_day(bins, phases, plot, title="a day's load: static peak fleet vs autoscaled")
    print(f"wrote {args.out / 'autoscale.md'}, {args.out / 'autoscale.json'}, {plot}")


if __name__ == "__main__":
    sys.exit(main())
