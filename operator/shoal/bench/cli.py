"""`shoal bench` (load against any OpenAI-compatible URL) and `shoal bench
compare` (routing policies side by side on fresh simulated fleets)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from shoal.api.router import RouterPolicy
from shoal.bench.compare import ComparePlan, run_compare
from shoal.bench.driver import ClosedLoop, OpenLoop, Pacing, Replay
from shoal.bench.local import FleetSpec
from shoal.bench.measure import first_model, measure
from shoal.bench.peers import PEERS, expand_peers
from shoal.bench.plot import plot_results, plot_run
from shoal.bench.report import (
    ideal_caption,
    knees_table,
    peers_line,
    replicas_table,
    results_table,
    ttft_table,
)
from shoal.bench.trace import TraceError, load_trace
from shoal.bench.workloads import GENERATORS, Workload, synthetic
from shoal.sim.profiles import DEFAULT_PROFILE, PROFILES

WORKLOADS = (*GENERATORS, "trace")
# Offered load (requests per engine second) for the default h100-llama3-8b
# profile on 4 replicas: busy enough for routing to matter. Sweeps span from
# light load to past round-robin's knee.
DEFAULT_RATE = {"shared-prefix": 60.0, "long-tail": 60.0, "random": 60.0, "trace": 10.0}
DEFAULT_SWEEP = {
    "shared-prefix": (25.0, 50.0, 75.0, 100.0),
    "long-tail": (20.0, 40.0, 60.0, 80.0),
    "random": (20.0, 40.0, 60.0, 80.0),
    "trace": (5.0, 10.0, 20.0),
}
# Simulated engines run this many times slower than real time in comparisons:
# four simulated H100s serve more than the Python load generator, router and
# simulator can drive on a small machine at real time, and a CPU-bound run
# measures the processes' Python, not the routing. The router's scrape timing
# is scaled to match (see bench.deployed.scrape_timing).
DEFAULT_COMPARE_TIME_SCALE = 0.25
DEFAULT_POLICIES = "round-robin,least-request,prefix,cache-aware"


def _workload_args(parser: argparse.ArgumentParser, *, duration: float) -> None:
    group = parser.add_argument_group("workload (seeded: the same flags give the same requests)")
    group.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    group.add_argument("--trace", type=Path, help="JSONL trace to replay (with --workload trace)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--num-requests", type=int, help="requests to send (default: rate x --duration)"
    )
    group.add_argument(
        "--duration",
        type=float,
        default=duration,
        help=f"engine seconds of offered load (default {duration:g})",
    )
    group.add_argument("--tenants", type=int, help="shared-prefix: tenants (system prompts)")
    group.add_argument("--system-words", type=int, help="shared-prefix: system prompt length")
    group.add_argument("--output-tokens", type=int, help="shared-prefix: tokens per answer")
    group.add_argument("--long-fraction", type=float, help="long-tail: share of very long requests")
    group.add_argument(
        "--no-user-field",
        action="store_true",
        help="shared-prefix: do not send the OpenAI `user` field (a router's session key)",
    )


def _output_args(parser: argparse.ArgumentParser, *, stem: str) -> None:
    group = parser.add_argument_group("output")
    group.add_argument(
        "--output", choices=["table", "json"], default="table", help="what goes to stdout"
    )
    group.add_argument("--save", type=Path, help="also write the JSON result here")
    group.add_argument(
        "--plot", type=Path, default=Path(f"{stem}.png"), help=f"PNG plot (default {stem}.png)"
    )
    group.add_argument("--no-plot", action="store_true")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="drive a seeded workload at an OpenAI-compatible URL; compare routing policies",
        description="Send a seeded workload (streamed) to --url and report TTFT, inter-token "
        "and end-to-end latency, throughput and errors under vllm bench serve's field names; "
        "with --engines, also the engines' own prefix hit rate, preemptions and work shares. "
        "`shoal bench compare` runs policies side by side on fresh simulated fleets.",
    )
    parser.add_argument("--url", help="the server (a router or one engine), e.g. http://host:8000")
    parser.add_argument(
        "--engines", default="", help="engine URLs (comma separated) whose /metrics to read"
    )
    parser.add_argument("--model", help="model name (default: the server's first)")
    load = parser.add_argument_group("load (default: Poisson at --rate; a trace at its times)")
    load.add_argument("--rate", type=float, help="open loop: requests per second")
    load.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="open loop: 1 is Poisson, below 1 burstier (gamma arrivals, as vllm bench serve)",
    )
    load.add_argument(
        "--concurrency", type=int, help="closed loop: clients each waiting for its answer"
    )
    load.add_argument(
        "--max-concurrency", type=int, help="open loop: at most this many requests in flight"
    )
    load.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="engine seconds per wall second (a simulator's --sim-time-scale)",
    )
    load.add_argument("--request-timeout", type=float, default=300.0)
    _workload_args(parser, duration=60.0)
    _output_args(parser, stem="shoal-bench")
    parser.set_defaults(func=run_bench)

    commands = parser.add_subparsers(dest="bench_command", metavar="COMMAND")
    compare = commands.add_parser(
        "compare",
        help="routing policies side by side on fresh simulated fleets",
        description="For each policy, start N fresh simulated engines (cold caches, same "
        "profile and seed) and a router, run the same seeded workload, and print one table "
        "and one plot with the policies side by side. --sweep runs a range of rates and "
        "finds each policy's knee.",
    )
    compare.add_argument("--replicas", type=int, default=4)
    compare.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"shoal's, comma separated (default {DEFAULT_POLICIES}; '' for none)",
    )
    compare.add_argument(
        "--peers",
        default="",
        help=f"peer routers run beside shoal's policies, comma separated: {', '.join(PEERS)} "
        "(each one's cache_aware and power_of_two) or "
        "PEER:POLICY (say smg:prefix_hash). Installed at their pinned versions into a "
        "cached venv of their own (~/.cache/shoal/peers-venv/) on first use",
    )
    compare.add_argument(
        "--router-replicas",
        type=int,
        default=1,
        help="routers of each kind, requests split among them at random (a Service "
        "without session affinity in front of several router pods)",
    )
    compare.add_argument(
        "--seeds",
        help="comma separated seeds: every run repeated per seed (workload, arrivals and "
        "simulators), tables showing the median and the spread of P99 TTFT (default: --seed)",
    )
    compare.add_argument(
        "--rate", type=float, help="requests per engine second (default per workload)"
    )
    compare.add_argument("--burstiness", type=float, default=1.0)
    compare.add_argument("--sweep", action="store_true", help="run every rate of --rates")
    compare.add_argument("--rates", help="comma separated rates for --sweep (default per workload)")
    compare.add_argument("--profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE)
    compare.add_argument(
        "--sim-time-scale",
        type=float,
        default=DEFAULT_COMPARE_TIME_SCALE,
        help="engine seconds per wall second (default 0.25: slower than real time, so the "
        "simulated GPUs, not this machine's CPU, are what saturates; rates and latencies are "
        "in engine time)",
    )
    compare.add_argument(
        "--kv-blocks",
        type=int,
        help="KV cache blocks per engine instead of the profile's (a smaller GPU)",
    )
    compare.add_argument(
        "--router-config",
        help="spec.router fields for every run: JSON (camelCase as in a VLLMCluster) or "
        "a file of it; its policy is replaced",
    )
    compare.add_argument(
        "--workdir", type=Path, help="where the fleets' logs go (default: a temporary directory)"
    )
    compare.add_argument("--request-timeout", type=float, default=300.0)
    _workload_args(compare, duration=20.0)
    _output_args(compare, stem="shoal-bench-compare")
    compare.set_defaults(func=run_compare_command)


def build_workload(
    args: argparse.Namespace, *, rate: float | None, seed: int | None = None
) -> Workload:
    if args.workload == "trace":
        if args.trace is None:
            raise SystemExit("shoal bench: --workload trace needs --trace FILE")
        try:
            return load_trace(args.trace, count=args.num_requests)
        except (OSError, TraceError) as error:
            raise SystemExit(f"shoal bench: {args.trace}: {error}") from error
    count = args.num_requests
    if count is None:
        if rate is None:
            raise SystemExit("shoal bench: give --num-requests with --concurrency")
        count = max(1, math.ceil(rate * args.duration))
    params: dict[str, object] = {}
    if args.workload == "shared-prefix":
        for flag in ("tenants", "system_words", "output_tokens"):
            if getattr(args, flag) is not None:
                params[flag] = getattr(args, flag)
        if args.no_user_field:
            params["send_user"] = False
    if args.workload == "long-tail" and args.long_fraction is not None:
        params["long_fraction"] = args.long_fraction
    seed = args.seed if seed is None else seed
    return synthetic(args.workload, count=count, seed=seed, **params)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def consoles() -> tuple[Console, Console]:
    """stderr (progress) and stdout (tables). Piped to a file, tables keep a
    readable width instead of rich's default of 80 columns."""
    width = None if sys.stdout.isatty() else 160
    return Console(stderr=True, width=width), Console(width=width)


def json_safe(value: Any) -> Any:
    """NaN (a statistic of nothing, a rate with no queries) becomes null: JSON
    has no NaN, and strict parsers refuse Python's."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _finish(args: argparse.Namespace, report: dict[str, Any], console: Console) -> None:
    text = json.dumps(json_safe(report), indent=2, allow_nan=False)
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(text + "\n")
    if args.output == "json":
        print(text)
    if not args.no_plot:
        console.print(f"plot: {args.plot}")


def run_bench(args: argparse.Namespace) -> int:
    if args.url is None:
        raise SystemExit("shoal bench: --url is required (or use `shoal bench compare`)")
    pacing: Pacing
    if args.concurrency is not None:
        pacing = ClosedLoop(concurrency=args.concurrency)
    elif args.rate is not None:
        pacing = OpenLoop(rate=args.rate, burstiness=args.burstiness, seed=args.seed)
    elif args.workload == "trace":
        pacing = Replay()
    else:
        raise SystemExit("shoal bench: give --rate (open loop) or --concurrency (closed loop)")
    workload = build_workload(args, rate=args.rate)
    engines = [e for e in args.engines.split(",") if e]
    console, stdout = consoles()
    model = args.model or asyncio.run(first_model(args.url))
    with _progress(console) as progress:
        task = progress.add_task(workload.name, total=len(workload.requests), failed=0)
        failures = 0

        def seen(outcome: Any) -> None:
            nonlocal failures
            failures += 0 if outcome.ok else 1
            progress.update(task, advance=1, failed=failures)

        result, outcomes = asyncio.run(
            measure(
                args.url,
                workload,
                model=model,
                pacing=pacing,
                engines=engines,
                time_scale=args.time_scale,
                request_timeout=args.request_timeout,
                max_concurrency=args.max_concurrency,
                on_outcome=seen,
            )
        )
    report = {"url": args.url, "model": model, "workload": workload.params, "result": result}
    if args.output == "table":
        label = {
            OpenLoop: f"rate {args.rate:g}/s, burstiness {args.burstiness:g}",
            ClosedLoop: f"{args.concurrency} clients",
            Replay: "trace timestamps",
        }[type(pacing)]
        stdout.print(
            results_table([{"label": label, **result}], title=f"shoal bench: {workload.name}")
        )
        if result.get("replicas"):
            stdout.print(replicas_table(result))
        if (parts := ttft_table([{"label": label, **result}])) is not None:
            stdout.print(parts)
        if result["errors"]:
            stdout.print("errors:", result["errors"])
    if not args.no_plot:
        plot_run(outcomes, result, args.plot, title=f"shoal bench: {workload.name} at {args.url}")
    _finish(args, report, console)
    return 0 if result["completed"] else 1


def _policies(args: argparse.Namespace) -> tuple[str, ...]:
    names = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    known = {p.value for p in RouterPolicy}
    unknown = [p for p in names if p not in known]
    if unknown:
        raise SystemExit(
            f"shoal bench compare: unknown policies {unknown}; choose from {sorted(known)}"
        )
    try:
        peers = expand_peers(args.peers)
    except ValueError as error:
        raise SystemExit(f"shoal bench compare: --peers: {error}") from error
    if not names + peers:
        raise SystemExit("shoal bench compare: no policy to run (--policies, --peers)")
    return names + peers


def run_compare_command(args: argparse.Namespace) -> int:
    if args.sweep:
        rates = (
            tuple(float(r) for r in args.rates.split(","))
            if args.rates
            else DEFAULT_SWEEP[args.workload]
        )
    else:
        rates = (args.rate or DEFAULT_RATE[args.workload],)
    router: dict[str, Any] = {}
    if args.router_config is not None:
        router = _router_config(args.router_config)
        router.pop("policy", None)
    seeds = (
        tuple(int(s) for s in args.seeds.split(",") if s.strip()) if args.seeds else (args.seed,)
    )
    if args.router_replicas < 1:
        raise SystemExit("shoal bench compare: --router-replicas must be at least 1")
    plan = ComparePlan(
        spec=FleetSpec(
            replicas=args.replicas,
            profile=args.profile,
            time_scale=args.sim_time_scale,
            seed=seeds[0],
            kv_blocks=args.kv_blocks,
        ),
        policies=_policies(args),
        rates=rates,
        workload_for=lambda rate, seed: build_workload(args, rate=rate, seed=seed),
        seeds=seeds,
        burstiness=args.burstiness,
        router=router,
        router_replicas=args.router_replicas,
        request_timeout=args.request_timeout,
    )
    console, stdout = consoles()
    with _progress(console) as progress:
        current: list[Any] = []

        def started(policy: str, rate: float, seed: int, count: int) -> None:
            described = f"{policy} @ {rate:g}/s" + (f" seed {seed}" if len(seeds) > 1 else "")
            current[:] = [progress.add_task(described, total=count, failed=0), 0]

        def seen(outcome: Any) -> None:
            current[1] += 0 if outcome.ok else 1
            progress.update(current[0], advance=1, failed=current[1])

        def partial(results: list[dict[str, Any]]) -> None:
            if args.save is not None:  # what a stopped sweep had measured
                args.save.parent.mkdir(parents=True, exist_ok=True)
                partial_path = args.save.with_suffix(".partial.json")
                partial_path.write_text(json.dumps(json_safe({"results": results}), indent=2))

        report = run_compare(
            plan, workdir=args.workdir, on_start=started, on_outcome=seen, on_result=partial
        )
    title = f"shoal bench compare: {args.workload}, {args.replicas} x {args.profile}"
    if args.kv_blocks is not None:
        title += f" ({args.kv_blocks} KV blocks)"
    if len(rates) == 1:
        title += f", {rates[0]:g} req/s"
    if args.router_replicas > 1:
        title += f", {args.router_replicas} routers each (random split)"
    if len(seeds) > 1:
        title += f", median of {len(seeds)} seeds"
    if args.sim_time_scale != 1:
        title += f" (engine time; simulators at {args.sim_time_scale:g}x real time)"
    rows = report.get("summary") or report["results"]
    # Not the report's workload: over several seeds that describes seed 0's.
    caption = ideal_caption(rows)
    if args.output == "table":
        stdout.print(results_table(rows, title=title, caption=caption))
        if (parts := ttft_table(rows)) is not None:
            stdout.print(parts)
        if report["peers"]:
            stdout.print(peers_line(rows))
        if "knees" in report:
            stdout.print(knees_table(report["knees"]))
        if report.get("operating_point"):
            point = report["operating_point"]
            stdout.print(
                f"round-robin's P99 TTFT first exceeds 2x its P50 at {point['rate']:g} req/s"
            )
    if not args.no_plot:
        plot_results(rows, args.plot, title=title)
    _finish(args, report, console)
    return 0 if all(r["completed"] for r in report["results"]) else 1


def _router_config(value: str) -> dict[str, Any]:
    """--router-config: inline JSON (as docs/benchmarks.md writes it) or a file's path."""
    try:
        text = value if value.lstrip().startswith("{") else Path(value).read_text()
        config = json.loads(text)
    except (OSError, ValueError) as error:
        raise SystemExit(f"shoal bench compare: --router-config: {error}") from error
    if not isinstance(config, dict):
        raise SystemExit("shoal bench compare: --router-config must be a JSON object")
    return config
