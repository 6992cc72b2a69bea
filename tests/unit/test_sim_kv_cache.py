"""The KV block pool and prefix cache behave as vLLM's do."""

from __future__ import annotations

from shoal.sim.kv_cache import BlockPool, extend_block_hashes, hash_block


def hashes(tokens: list[int], block_size: int) -> list[bytes]:
    out: list[bytes] = []
    extend_block_hashes(out, tokens, block_size)
    return out


def cache_sequence(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Hold blocks for tokens and register the full ones, as a finished prefill does."""
    blocks = pool.allocate(-(-len(tokens) // pool.block_size))
    assert blocks is not None
    pool.cache(blocks, hashes(tokens, pool.block_size))
    return blocks


def test_block_hashes_chain_so_equal_blocks_after_different_prefixes_differ() -> None:
    a = hashes([1] * 16 + [2] * 16, 16)
    b = hashes([3] * 16 + [2] * 16, 16)
    assert len(a) == 2
    assert a[1] != b[1]
    assert a[1] == hash_block(a[0], [2] * 16)
    assert len(hashes(list(range(40)), 16)) == 2  # full blocks only


def test_fully_cached_prompt_hits_whole_blocks_and_never_its_last_token() -> None:
    pool = BlockPool(num_blocks=64, block_size=128)
    prompt = list(range(600))
    pool.release(cache_sequence(pool, prompt))
    # The fixtures README: a 600-token prompt sent twice hit 512 tokens (4 blocks).
    assert len(pool.lookup(hashes(prompt, 128), num_tokens=600)) * 128 == 512
    # A prompt of exactly 5 blocks: the last token must be computed, so 4 hit.
    five = list(range(640))
    pool.release(cache_sequence(pool, five))
    assert len(pool.lookup(hashes(five, 128), num_tokens=640)) == 4
    # One token more and the 5th block may hit.
    assert len(pool.lookup(hashes([*five, 7], 128), num_tokens=641)) == 5


def test_a_prefix_hit_stops_at_the_first_block_that_differs() -> None:
    pool = BlockPool(num_blocks=16, block_size=4)
    pool.release(cache_sequence(pool, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]))
    other = [1, 2, 3, 4, 0, 6, 7, 8, 9, 10, 11, 12, 13]
    assert len(pool.lookup(hashes(other, 4), num_tokens=len(other))) == 1


def test_usage_counts_held_blocks_only_and_drops_to_zero_while_cache_survives() -> None:
    pool = BlockPool(num_blocks=64, block_size=128)
    blocks = cache_sequence(pool, list(range(55 * 128)))
    # 55 held of 63 usable (block 0 is vLLM's null block): the fixture's 0.873.
    assert abs(pool.usage() - 0.873015873015873) < 1e-12
    pool.release(blocks)
    assert pool.usage() == 0.0
    assert pool.num_cached == 55
    assert len(pool.lookup(hashes(list(range(55 * 128)), 128), num_tokens=55 * 128 + 1)) == 55


def test_eviction_takes_least_recently_freed_blocks_and_tails_before_prefixes() -> None:
    pool = BlockPool(num_blocks=5, block_size=2)  # 4 usable blocks
    first = [1, 2, 3, 4]
    second = [5, 6, 7, 8]
    pool.release(cache_sequence(pool, first))
    pool.release(cache_sequence(pool, second))
    # Two fresh blocks evict the two least recently freed: first's tail, then its head.
    fresh = pool.allocate(1)
    assert fresh is not None
    assert len(pool.lookup(hashes([*first, 0], 2), num_tokens=5)) == 1  # tail gone
    pool.allocate(1)
    assert pool.lookup(hashes([*first, 0], 2), num_tokens=5) == []
    assert len(pool.lookup(hashes([*second, 0], 2), num_tokens=5)) == 2


def test_held_blocks_are_never_evicted_and_allocation_fails_whole() -> None:
    pool = BlockPool(num_blocks=4, block_size=2)
    held = cache_sequence(pool, [1, 2, 3, 4])
    assert pool.allocate(2) is None
    assert pool.num_free == 1
    assert len(pool.lookup(hashes([1, 2, 3, 4, 0], 2), num_tokens=5)) == 2
    pool.release(held)


def test_taking_a_cached_block_nobody_holds_costs_a_free_block() -> None:
    pool = BlockPool(num_blocks=8, block_size=2)
    pool.release(cache_sequence(pool, [1, 2, 3, 4]))
    hit = pool.lookup(hashes([1, 2, 3, 4, 5], 2), num_tokens=5)
    assert pool.num_needed(hit, num_blocks=3) == 3
    pool.take(hit)
    assert pool.num_free == 5
    assert pool.num_needed(hit, num_blocks=3) == 1  # now held: only the new block


def test_caching_off_never_hits() -> None:
    pool = BlockPool(num_blocks=8, block_size=2, enable_caching=False)
    pool.release(cache_sequence(pool, [1, 2, 3, 4]))
    assert pool.lookup(hashes([1, 2, 3, 4, 5], 2), num_tokens=5) == []
