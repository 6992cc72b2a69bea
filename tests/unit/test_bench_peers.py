"""Peer routers in the benchmarks (pure parts): which policies `--peers`
runs, how a peer is started, what its cached venv is keyed by, and how runs
over several seeds sum up."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from shoal.bench.compare import over_seeds
from shoal.bench.peers import PEERS, expand_peers, parse_peer_policy, pins_key
from shoal.bench.report import ideal_caption


def test_a_bare_peer_name_runs_its_best_policies_and_peer_policy_just_that_one() -> None:
    assert expand_peers("vllm-router,smg:prefix_hash") == (
        "vllm-router:cache_aware",
        "vllm-router:power_of_two",
        "smg:prefix_hash",
    )
    assert expand_peers("smg, smg:cache_aware") == ("smg:cache_aware", "smg:power_of_two")
    assert expand_peers("") == ()


@pytest.mark.parametrize("text", ["nginx", "smg:nope", "vllm-router:prefix_hash"])
def test_an_unknown_peer_or_policy_is_refused_with_the_choices(text: str) -> None:
    with pytest.raises(ValueError, match="choose from"):
        expand_peers(text)


def test_a_peer_listens_on_loopback_with_a_prometheus_port_of_its_own() -> None:
    argv = parse_peer_policy("smg:cache_aware").argv(
        Path("/venv"), port=8001, prometheus_port=8002, engines=["http://a:1", "http://b:2"]
    )
    assert argv[:2] == ["/venv/bin/smg", "launch"]
    flags = " ".join(argv)
    assert "--host 127.0.0.1 --port 8001" in flags
    assert "--worker-urls http://a:1 http://b:2" in flags
    assert "--prometheus-port 8002 --prometheus-host 127.0.0.1" in flags
    assert "--policy cache_aware" in flags
    assert "29000" not in flags


def test_the_peers_venv_is_keyed_by_the_pins() -> None:
    peers = tuple(PEERS.values())
    bumped = (dataclasses.replace(peers[0], version="9.9.9"), *peers[1:])
    assert pins_key(peers) == pins_key(peers)
    assert pins_key(bumped) != pins_key(peers)


def _run(policy: str, seed: int, p99: float, hits: float) -> dict[str, object]:
    return {
        "policy": policy,
        "rate": 10.0,
        "seed": seed,
        "router": "smg",
        "version": "1.13.0",
        "router_replicas": 1,
        "p99_ttft_ms": p99,
        "mean_ttft_ms": p99 / 4,
        "prefix_hit_rate": hits,
    }


def test_seeds_sum_up_to_medians_with_the_p99_spread_and_nan_left_out() -> None:
    runs = [
        _run("a", 0, 300.0, 0.5),
        _run("a", 1, 100.0, 0.7),
        _run("a", 2, 200.0, math.nan),
        _run("b", 0, 50.0, 0.1),
    ]
    rows = {row["policy"]: row for row in over_seeds(runs)}
    assert rows["a"]["p99_ttft_ms"] == 200.0
    assert (rows["a"]["p99_ttft_ms_min"], rows["a"]["p99_ttft_ms_max"]) == (100.0, 300.0)
    assert rows["a"]["prefix_hit_rate"] == pytest.approx(0.6)
    assert rows["a"]["seeds"] == [0, 1, 2]
    assert rows["b"]["p99_ttft_ms"] == 50.0


def test_over_seeds_the_ideal_hit_rate_shown_is_their_median_not_the_first_seeds() -> None:
    """Beside median hit rates, seed 0's ideal (82.4% in session 23's run)
    sat below shoal's median hits (83.9%), as if it beat one infinite replica."""
    ideals = {0: 0.824, 1: 0.832, 2: 0.839, 3: 0.853, 4: 0.839}
    runs = [
        {**_run(policy, seed, 120.0, 0.83), "ideal_prefix_hit_rate": ideal}
        for policy in ("cache-aware", "smg:cache_aware")
        for seed, ideal in ideals.items()
    ]
    caption = ideal_caption(over_seeds(runs))
    assert caption == "prefix hits of one infinitely large replica: 83.9% (median of 5 seeds)"
    # One seed: its own; a sweep (rates differ in it): none.
    assert ideal_caption(runs[:1]) == "prefix hits of one infinitely large replica: 82.4%"
    assert ideal_caption([runs[0], {**runs[1], "rate": 30.0}]) is None
