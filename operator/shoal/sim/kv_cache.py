"""The KV block pool with vLLM's prefix cache.

As in vLLM v1 (`v1/core/block_pool.py`, `kv_cache_utils.py`):

- Block 0 is the null block and never holds tokens, so a pool of N blocks has
  N - 1 usable ones and usage is (blocks held) / (N - 1): 55 held of 64 reads
  0.873, as in the fixture `metrics.loaded.txt`.
- Only full blocks are cached, keyed by a chained hash of (parent hash, the
  block's token ids), so a block hit implies the whole prefix before it hit.
- A block no request holds goes to the tail of the free queue but keeps its
  hash: it counts as free (usage falls to 0 when the engine is idle) and is
  still hit until it is reused for new tokens, least recently freed first.
- A lookup never covers the prompt's last token (the model must compute it to
  sample the next one), so a fully cached n-token prompt hits
  floor((n - 1) / B) * B tokens.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes
# The chain's root, as vLLM's NONE_HASH is the hash of a fixed string.
NONE_HASH: BlockHash = hashlib.sha256(b"shoal-sim-none-hash").digest()


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    h = hashlib.sha256(parent or NONE_HASH)
    h.update(array("I", token_ids).tobytes())
    return h.digest()


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int) -> None:
    """Append the hashes of the full blocks of token_ids not yet hashed."""
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block(parent, token_ids[start : start + block_size]))


class BlockPool:
    def __init__(self, *, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("a KV pool needs at least 2 blocks (one is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref_count = [0] * num_blocks
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        # Insertion-ordered dict as the free queue: first key = evicted first.
        self._free: dict[int, None] = dict.fromkeys(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks no request holds, cached ones included."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def lookup(self, hashes: Sequence[BlockHash], *, num_tokens: int) -> list[int]:
        """The cached blocks of the longest cached prefix of an n-token sequence."""
        if not self.enable_caching:
            return []
        max_blocks = (num_tokens - 1) // self.block_size
        hit: list[int] = []
        for block_hash in hashes[:max_blocks]:
            block = self._cached.get(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def num_needed(self, hit: Sequence[int], *, num_blocks: int) -> int:
        """Free blocks it takes to hold num_blocks blocks, of which hit are cached:
        new blocks, plus the hit blocks nobody holds (taking them leaves the free queue)."""
        return num_blocks - len(hit) + sum(1 for b in hit if self._ref_count[b] == 0)

    def take(self, blocks: Sequence[int]) -> None:
        """Hold cached blocks (a prefix hit)."""
        for block in blocks:
            if self._ref_count[block] == 0:
                del self._free[block]
            self._ref_count[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """Fresh blocks for new tokens, evicting the least recently freed cached
        blocks; None (and nothing taken) if fewer than count are free."""
        if count > len(self._free):
            return None
        blocks = []
        for _ in range(count):
            block = next(iter(self._free))
            del self._free[block]
            old = self._hash_of[block]
            if old is not None:
                self._hash_of[block] = None
                if self._cached.get(old) == block:
                    del self._cached[old]
            self._ref_count[block] = 1
            blocks.append(block)
        return blocks

    def cache(self, blocks: Sequence[int], hashes: Sequence[BlockHash]) -> None:
        """Register full blocks under their hashes (a hash already cached keeps
        its first block; the duplicate is just not cached)."""
        if not self.enable_caching:
            return
        for block, block_hash in zip(blocks, hashes, strict=False):
            if self._hash_of[block] is None and block_hash not in self._cached:
                self._hash_of[block] = block_hash
                self._cached[block_hash] = block

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's hold. Its last blocks are queued first, so they are
        evicted before the shared prefix blocks in front of them."""
        for block in reversed(blocks):
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                self._free[block] = None

    def reset_cache(self) -> bool:
        """Forget every cached block, if no request holds a block."""
        if self.num_free != self.num_blocks - 1:
            return False
        self._cached.clear()
        self._hash_of = [None] * self.num_blocks
        return True
