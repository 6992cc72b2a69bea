"""Router decision time and prefix-index memory, in process (no I/O).

Decision time is what the router's request path spends between a parsed
request and the chosen replica: hashing the prompt's prefix blocks, building
the candidates from the fleet's latest signals and the prefix index, and the
policy. Target (issue 5): p99 <= 100 us with 64 replicas and 8k-character
prompts.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time

from shoal.api.router import RouterPolicy
from shoal.bench.stats import percentile
from shoal.engine.metrics import MetricsSnapshot
from shoal.router.config import RouterConfig
from shoal.router.fleet import Endpoint, Fleet
from shoal.router.heap import settle
from shoal.router.policy import Chooser
from shoal.router.prefix import prefix_key, request_facts


def _prompt(rng: random.Random, shared: list[str], chars: int) -> str:
    head = rng.choice(shared)
    tail = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=max(chars - len(head), 0)))
    return (head + tail)[:chars]


def decision_times(
    *, replicas: int, prompt_chars: int, requests: int, policy: RouterPolicy, seed: int = 0
) -> list[float]:
    settle()  # as the router does once it is up, before its fleet and index fill
    rng = random.Random(seed)
    config = RouterConfig(policy=policy)
    fleet = Fleet(config)
    fleet.update(
        Endpoint(id=f"uid-{i}", name=f"c-r{i}-0", url=f"http://127.0.0.1:{9000 + i}", routable=True)
        for i in range(replicas)
    )
    now = time.monotonic()
    for i, replica in enumerate(fleet.replicas.values()):
        signals = MetricsSnapshot(
            running=rng.randint(0, 200), waiting=rng.randint(0, 5), kv_usage=rng.uniform(0.1, 0.8)
        )
        fleet.record_scrape(replica.id, signals, now + 3600)  # stays fresh during the run
        replica.inflight = i % 7
    fleet.sweep(now)
    # 200 shared system prompts of 2-6k characters, as many tenants' would be.
    shared = ["".join(rng.choices("ABCDEFGH ", k=rng.randint(2000, 6000))) for _ in range(200)]
    chooser = Chooser(config, rng=rng)
    ids = list(fleet.replicas)
    for _ in range(2000):  # warm the prefix index
        key = prefix_key(
            _prompt(rng, shared, prompt_chars),
            block_chars=config.thresholds.prefix_block_chars,
            max_blocks=config.thresholds.max_prefix_blocks,
        )
        fleet.index.record(rng.choice(ids), key.hashes)
    samples = []
    prompts = [_prompt(rng, shared, prompt_chars) for _ in range(requests)]
    for prompt in prompts:
        started = time.perf_counter()
        key = prefix_key(
            prompt,
            block_chars=config.thresholds.prefix_block_chars,
            max_blocks=config.thresholds.max_prefix_blocks,
        )
        facts = request_facts(prompt, key, config)
        choice, _ = fleet.decide(chooser, key, facts)
        samples.append(time.perf_counter() - started)
        assert choice is not None
        fleet.index.record(choice.replica, key.hashes)
    return samples


def index_memory(*, prefixes: int, replicas: int, blocks_per_prompt: int) -> dict[str, object]:
    """RSS growth after recording `prefixes` distinct prompts into the index."""
    config = RouterConfig()
    fleet = Fleet(config)
    fleet.update(
        Endpoint(id=f"uid-{i}", name=f"r{i}", url="http://x", routable=True)
        for i in range(replicas)
    )
    ids = list(fleet.replicas)
    before = _rss_mib()
    rng = random.Random(1)
    # RSS at every tenth of the run: once the index is full (at about
    # bound / blocks_per_prompt prompts) it must stay flat.
    marks = {prefixes * i // 10 for i in range(1, 11)}
    curve: dict[int, float] = {}
    for n in range(1, prefixes + 1):
        # Distinct prompts: every block hash is new (the worst case for memory).
        base = rng.getrandbits(60) << 4
        fleet.index.record(ids[n % replicas], [base + k for k in range(blocks_per_prompt)])
        if n in marks:
            curve[n] = round(_rss_mib(), 1)
    after = _rss_mib()
    bound = replicas * config.thresholds.index_blocks_per_replica
    return {
        "prefixes": prefixes,
        "index_blocks": len(fleet.index),
        "bound_blocks": bound,
        "index_full_after_prefixes": bound // blocks_per_prompt,
        "rss_growth_mib": round(after - before, 1),
        "rss_mib": round(after, 1),
        "rss_mib_by_prefixes_seen": curve,
        "rss_growth_last_half_mib": round(after - curve[prefixes * 5 // 10], 1) + 0.0,
    }


def _rss_mib() -> float:
    """Resident set size now (not the peak, which earlier phases set)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--prompt-chars", type=int, default=8192)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--prefixes", type=int, default=1_000_000)
    args = parser.parse_args()
    # Memory first, in a fresh heap: 1M distinct prompts of 8 checkpoints each.
    memory = index_memory(prefixes=args.prefixes, replicas=args.replicas, blocks_per_prompt=8)
    results: dict[str, object] = {}
    for policy in (RouterPolicy.CACHE_AWARE, RouterPolicy.SESSION, RouterPolicy.ROUND_ROBIN):
        samples = decision_times(
            replicas=args.replicas,
            prompt_chars=args.prompt_chars,
            requests=args.requests,
            policy=policy,
        )
        results[policy.value] = {
            "p50_us": round(percentile(samples, 50) * 1e6, 1),
            "p99_us": round(percentile(samples, 99) * 1e6, 1),
            "max_us": round(max(samples) * 1e6, 1),
        }
    report = {
        "replicas": args.replicas,
        "prompt_chars": args.prompt_chars,
        "decision": results,
        "memory": memory,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
