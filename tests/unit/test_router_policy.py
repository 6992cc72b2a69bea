"""The router's pure parts: prefix hashing, the prefix index, load scores
and every policy, on plain data (the circuit breaker: test_router_breaker)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from shoal.api.router import RouterPolicy
from shoal.engine.metrics import MetricsSnapshot
from shoal.router.config import RouterConfig
from shoal.router.fleet import Endpoint, Fleet
from shoal.router.index import PrefixIndex
from shoal.router.policy import Candidate, Chooser, RequestFacts
from shoal.router.prefix import checkpoints, prefix_key, render_prompt, request_facts
from shoal.router.signals import load_from_signals


def test_prefix_keys_chain_so_equal_hashes_mean_equal_prefixes() -> None:
    a = prefix_key("x" * 64 + "y" * 64 + "z" * 10, block_chars=64, max_blocks=10)
    b = prefix_key("x" * 64 + "w" * 64, block_chars=64, max_blocks=10)
    c = prefix_key("q" * 64 + "y" * 64, block_chars=64, max_blocks=10)
    assert a.blocks == 2 and len(a.hashes) == 2, "a partial last block is not cacheable"
    assert a.hashes[0] == b.hashes[0] and a.hashes[1] != b.hashes[1]
    assert c.hashes[1] != a.hashes[1], "the same block after a different prefix hashes differently"
    assert prefix_key("é" * 130, block_chars=64, max_blocks=10) == prefix_key(
        "é" * 128, block_chars=64, max_blocks=10
    )


def test_long_prompts_keep_log_spaced_checkpoints_shared_by_every_prompt() -> None:
    assert checkpoints(20) == [*range(16), 17, 19]
    long = prefix_key("a" * 64 * 500, block_chars=64, max_blocks=256)
    assert long.blocks == 256 and len(long.hashes) == 48
    # A longer prompt with the same start has the same checkpoint hashes.
    longer = prefix_key("a" * 64 * 500 + "b" * 64 * 20, block_chars=64, max_blocks=512)
    assert longer.hashes[:48] == long.hashes
    # Holding the first 17 checkpoints (blocks 0-15 and 17) covers 18 of 256 blocks.
    assert long.held_share(17) == 18 / 256
    assert long.held_share(48) == 1.0 and long.held_share(0) == 0.0


def test_chat_rendering_keeps_order_and_roles() -> None:
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    swapped = {"messages": [{"role": "user", "content": "S"}, {"role": "system", "content": "U"}]}
    assert render_prompt(chat) != render_prompt(swapped)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "U"}]}]}
    assert render_prompt(parts) == render_prompt({"messages": [{"role": "user", "content": "U"}]})
    assert render_prompt({"prompt": ["first", "second"]}) == "first"


def test_index_matches_leading_blocks_and_forgets_old_and_removed() -> None:
    index = PrefixIndex(blocks_per_replica=4)
    for r in ("a", "b", "c"):
        index.add_replica(r)
    index.record("a", [1, 2, 3])
    index.record("b", [1, 2])
    assert index.match([1, 2, 3, 9]) == {"a": 3, "b": 2}
    assert index.match([7, 1]) == {}, "a prefix match must start at the first block"
    index.record("a", [4, 5])  # capacity 4: the oldest block goes, and that is
    # a's tail (3): a prompt's head is recorded last, as vLLM frees tails first.
    assert index.match([1, 2, 3]) == {"a": 2, "b": 2}
    index.remove_replica("b")
    assert index.match([1, 2]) == {"a": 2}
    index.add_replica("d")  # reuses b's slot, starts cold
    assert "d" not in index.match([1, 2])
    assert len(index) == 4  # a's 2,3,4,5 only: nothing of b survives


def test_one_replica_depth_agrees_with_the_whole_match() -> None:
    rng = random.Random(5)
    index = PrefixIndex(blocks_per_replica=64)
    replicas = [f"r{i}" for i in range(8)]
    for r in replicas:
        index.add_replica(r)
    for _ in range(200):
        index.record(rng.choice(replicas), [rng.randrange(6) for _ in range(rng.randrange(1, 9))])
    for _ in range(200):
        blocks = [rng.randrange(6) for _ in range(rng.randrange(1, 9))]
        whole = index.match(blocks)
        assert {r: index.depth(r, blocks) for r in replicas if index.depth(r, blocks)} == whole
    assert index.depth("unknown", [1]) == 0


def test_policies_that_ignore_hits_still_report_the_chosen_replicas_hit() -> None:
    """Round-robin skips matching the prompt against every replica but its
    choice carries the chosen replica's hit (the prefill estimate needs it)."""
    config = RouterConfig(policy=RouterPolicy.ROUND_ROBIN)
    fleet = Fleet(config)
    fleet.update(
        [Endpoint(id=f"r{i}", name=f"r{i}", url=f"http://r{i}", routable=True) for i in range(3)]
    )
    prompt = "You are a helpful assistant. " * 40
    key = prefix_key(
        prompt,
        block_chars=config.thresholds.prefix_block_chars,
        max_blocks=config.thresholds.max_prefix_blocks,
    )
    facts = request_facts(prompt, key, config)
    fleet.index.record("r1", key.hashes)
    chooser = Chooser(config)
    assert not chooser.weighs_hits
    hits = {}
    for _ in range(3):
        choice, anyone = fleet.decide(chooser, key, facts)
        assert anyone and choice is not None
        hits[choice.replica] = choice.predicted_hit
    assert hits == {"r0": 0.0, "r1": 1.0, "r2": 0.0}
    none, anyone = fleet.decide(chooser, key, facts, exclude=frozenset({"r0", "r1", "r2"}))
    assert none is None and not anyone


def test_load_score_weights_inflight_and_staleness() -> None:
    config = RouterConfig(max_num_seqs=10)
    idle = MetricsSnapshot()
    assert load_from_signals(idle, inflight=0, config=config).score == 0.0
    # The router's own in-flight count moves before the next scrape does.
    assert load_from_signals(idle, inflight=5, config=config).score == pytest.approx(0.1)
    busy = MetricsSnapshot(running=10, waiting=10, kv_usage=0.8)
    assert load_from_signals(busy, inflight=0, config=config).score == pytest.approx(
        0.5 * 0.8 + 0.3 * 0.5 + 0.2 * 1.0
    )
    assert load_from_signals(MetricsSnapshot(kv_usage=0.96), inflight=0, config=config).saturated
    stale = load_from_signals(None, inflight=0, config=config)
    assert stale.score == 1.0 and stale.saturated


def fleet(loads: list[float], hits: list[float] | None = None) -> list[Candidate]:
    hits = hits or [0.0] * len(loads)
    return [
        Candidate(f"r{i}", load, False, int(load * 100), hit, requests=int(load * 100))
        for i, (load, hit) in enumerate(zip(loads, hits, strict=True))
    ]


def prompt(key: int, tokens: float = 512) -> RequestFacts:
    """A request whose prompt is `tokens` long, all of it in prefix blocks."""
    return RequestFacts(affinity_key=key, prompt_tokens=tokens, prefix_tokens=tokens)


def test_cache_aware_prefers_the_warm_replica_within_bounded_load() -> None:
    chooser = Chooser(RouterConfig())
    assert chooser.choose(fleet([0.2, 0.2, 0.2], [0.0, 0.9, 0.0]), prompt(42)).replica == "r1"  # type: ignore[union-attr]
    # r1 holds the prefix but carries far more requests than the mean:
    # bounded load sends the request elsewhere.
    assert chooser.choose(fleet([0.1, 0.9, 0.1], [0.0, 0.9, 0.0]), prompt(42)).replica != "r1"  # type: ignore[union-attr]


def test_a_lightly_loaded_holder_keeps_its_prefix_by_default() -> None:
    """Five requests on the holder of a hot prompt, two on each other replica:
    light load, so the prompt stays where it is cached (measured beside smg, a
    spill at this load cost hits: docs/benchmarks.md). Fails with a floor of 4."""
    chooser = Chooser(RouterConfig())
    candidates = [Candidate("r0", 0.1, False, 5, 1.0, requests=5)] + [
        Candidate(f"r{i}", 0.04, False, 2, 0.0, requests=2) for i in (1, 2, 3)
    ]
    assert chooser.choose(candidates, prompt(7, 3000)).replica == "r0"  # type: ignore[union-attr]


def test_cache_aware_weighs_prefill_queued_ahead_against_the_hit() -> None:
    """A warm replica with a long prefill queued from this router loses to a
    cold idle one once the queue costs more than its cached prompt is worth
    (hitWeight x its tokens: 4,000 by default)."""
    chooser = Chooser(RouterConfig())

    def with_pending(pending: float) -> list[Candidate]:
        return [
            Candidate("r0", 0.0, False, 1, 1.0, pending=pending, requests=1),
            Candidate("r1", 0.0, False, 0, 0.0),
        ]

    assert chooser.choose(with_pending(200), prompt(5, 2000)).replica == "r0"  # type: ignore[union-attr]
    assert chooser.choose(with_pending(5000), prompt(5, 2000)).replica == "r1"  # type: ignore[union-attr]
    # A short request stays clear of a replica busy prefilling a long prompt.
    busy = [
        Candidate("r0", 0.0, False, 1, 0.0, pending=6000, requests=1),
        Candidate("r1", 0.0, False, 1, 0.0, pending=0, requests=1),
    ]
    assert {chooser.choose(busy, prompt(k, 100)).replica for k in range(32)} == {"r1"}  # type: ignore[union-attr]


def test_hit_weight_keeps_a_prompt_with_its_cache_against_more_queued_work() -> None:
    """A cached token counted twice (the default): the warm replica keeps the
    prompt with a queue that sends it to the idle one at a weight of 1."""
    candidates = [
        Candidate("r0", 0.0, False, 1, 1.0, pending=3000, requests=1),
        Candidate("r1", 0.0, False, 0, 0.0),
    ]
    plain = RouterConfig.model_validate({"thresholds": {"hitWeight": 1.0}})
    assert Chooser(plain).choose(candidates, prompt(5, 2000)).replica == "r1"  # type: ignore[union-attr]
    assert Chooser(RouterConfig()).choose(candidates, prompt(5, 2000)).replica == "r0"  # type: ignore[union-attr]


def test_cold_prompts_spread_by_the_prefill_they_queue() -> None:
    """A burst of distinct cold prompts (nothing finishes meanwhile) lands
    evenly by prefill work, whatever their hashes say."""
    chooser = Chooser(RouterConfig())
    pending = Counter[str]()
    rng = random.Random(3)
    for n in range(200):
        tokens = rng.choice([300, 3000])
        candidates = [
            Candidate(r, 0.0, False, 0, 0.0, pending=pending[r]) for r in ("r0", "r1", "r2", "r3")
        ]
        pick = chooser.choose(candidates, prompt(n, tokens))
        assert pick is not None
        pending[pick.replica] += tokens
    assert max(pending.values()) - min(pending.values()) <= 3000 + 0.05 * 5048, pending


def test_hot_shared_prefix_spreads_under_bounded_load() -> None:
    """Every request shares a prefix the first replica holds; the replicas'
    loads follow what was sent. No replica gets over (1 + eps) x its share."""
    config = RouterConfig.model_validate({"thresholds": {"epsilon": 0.25}, "maxNumSeqs": 64})
    chooser = Chooser(config)
    inflight = Counter[str]()
    for n in range(200):
        candidates = [
            Candidate(
                r,
                inflight[r] * config.weights.running / 64,
                False,
                inflight[r],
                0.9 if r == "r0" else 0.0,
                requests=inflight[r],
            )
            for r in ("r0", "r1", "r2", "r3")
        ]
        pick = chooser.choose(candidates, prompt(n))
        assert pick is not None
        inflight[pick.replica] += 1
    assert max(inflight.values()) <= 1.25 * 200 / 4 + 1, inflight


def test_cold_prefixes_go_by_rendezvous_so_routers_agree() -> None:
    a, b = Chooser(RouterConfig()), Chooser(RouterConfig())
    agree = 0
    rng = random.Random(7)
    for key in range(500):
        # Each router sees slightly different loads (scraped at other moments).
        loads_a = [rng.uniform(0.1, 0.12) for _ in range(8)]
        loads_b = [x + rng.uniform(-0.01, 0.01) for x in loads_a]
        pick_a = a.choose(fleet(loads_a), prompt(key))
        pick_b = b.choose(fleet(loads_b), prompt(key))
        agree += pick_a is not None and pick_b is not None and pick_a.replica == pick_b.replica
    assert agree >= 0.9 * 500
    spread = Counter(
        a.choose(fleet([0.1] * 8), prompt(k)).replica  # type: ignore[union-attr]
        for k in range(800)
    )
    assert len(spread) == 8 and min(spread.values()) > 50, "rendezvous spreads cold prefixes"


def test_session_affinity_holds_below_threshold_and_yields_above() -> None:
    chooser = Chooser(
        RouterConfig.model_validate({"policy": "session", "thresholds": {"affinityThreshold": 0.7}})
    )
    facts = RequestFacts(affinity_key=1, session_key=1234)
    home = chooser.choose(fleet([0.3] * 4), facts)
    assert home is not None
    for _ in range(5):
        assert chooser.choose(fleet([0.3] * 4), facts).replica == home.replica  # type: ignore[union-attr]
    loads = [0.3] * 4
    loads[int(home.replica[1:])] = 0.8
    moved = chooser.choose(fleet(loads), facts)
    assert moved is not None and moved.replica != home.replica


def test_baseline_policies() -> None:
    facts = RequestFacts(affinity_key=1)
    rr = Chooser(RouterConfig(policy=RouterPolicy.ROUND_ROBIN))
    assert [rr.choose(fleet([0.5] * 3), facts).replica for _ in range(6)] == [  # type: ignore[union-attr]
        "r0",
        "r1",
        "r2",
        "r0",
        "r1",
        "r2",
    ]
    least = Chooser(RouterConfig(policy=RouterPolicy.LEAST_REQUEST))
    assert least.choose(fleet([0.5, 0.1, 0.3]), facts).replica == "r1"  # type: ignore[union-attr]
    load = Chooser(RouterConfig(policy=RouterPolicy.LOAD_AWARE))
    assert load.choose(fleet([0.5, 0.3, 0.1], [0.0, 0.0, 0.0]), facts).replica == "r2"  # type: ignore[union-attr]
    p2 = Chooser(RouterConfig(policy=RouterPolicy.POWER_OF_TWO), rng=random.Random(1))
    picks = Counter(p2.choose(fleet([0.9, 0.1]), facts).replica for _ in range(20))  # type: ignore[union-attr]
    assert picks == {"r1": 20}
    prefix = Chooser(RouterConfig(policy=RouterPolicy.PREFIX))
    # prefix ignores load (like production-stack's), short of saturation.
    assert prefix.choose(fleet([0.9, 0.1], [1.0, 0.0]), facts).replica == "r0"  # type: ignore[union-attr]


def test_saturated_everywhere_means_queue() -> None:
    saturated = [Candidate(f"r{i}", 1.0, True, 300) for i in range(3)]
    for policy in RouterPolicy:
        assert Chooser(RouterConfig(policy=policy)).choose(saturated, RequestFacts(1)) is None


def test_idle_fleet_goes_by_hit_then_rendezvous() -> None:
    chooser = Chooser(RouterConfig())
    assert chooser.choose(fleet([0.0] * 4, [0.0, 0.0, 0.5, 0.0]), prompt(3)).replica == "r2"  # type: ignore[union-attr]
    picks = {chooser.choose(fleet([0.0] * 4), prompt(k)).replica for k in range(64)}  # type: ignore[union-attr]
    assert len(picks) == 4
