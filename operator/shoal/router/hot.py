"""The most shared prompt prefixes, for warm-up (off by default: prompts may
be private). A space-saving top-K sketch over prefix-block hashes at a few
depths, so memory stays bounded however many distinct prompts pass."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.router.prefix import CHECKPOINTS, PrefixKey

_CHECKPOINT_INDEX = {block: i for i, block in enumerate(CHECKPOINTS)}


@dataclass
class _Entry:
    text: str
    count: int
    error: int


class HotPrefixes:
    def __init__(self, *, top_k: int, max_chars: int, block_chars: int) -> None:
        self.capacity = top_k * 4  # track more than reported, as space-saving advises
        self.top_k = top_k
        self.max_chars = max_chars
        self.block_chars = block_chars
        self._entries: dict[int, _Entry] = {}

    def observe(self, text: str, key: PrefixKey) -> None:
        """Count the prompt's prefixes of 1, 2, 4, ... blocks (up to max_chars).
        Blocks 2^k - 1 are always checkpoints, so their hashes are at hand."""
        depth = 1
        while depth <= key.blocks and depth * self.block_chars <= self.max_chars:
            self._count(key.hashes[_CHECKPOINT_INDEX[depth - 1]], text[: depth * self.block_chars])
            depth *= 2

    def _count(self, key: int, prefix: str) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.count += 1
            return
        if len(self._entries) < self.capacity:
            self._entries[key] = _Entry(prefix, 1, 0)
            return
        victim = min(self._entries, key=lambda k: self._entries[k].count)
        floor = self._entries.pop(victim).count
        self._entries[key] = _Entry(prefix, floor + 1, floor)

    def top(self, *, min_count: int = 2) -> list[dict[str, object]]:
        """Longest-first among the most counted: a longer shared prefix warms more."""
        ranked = sorted(self._entries.values(), key=lambda e: (e.count, len(e.text)), reverse=True)
        return [
            {"prompt": e.text, "count": e.count}
            for e in ranked[: self.top_k]
            if e.count - e.error >= min_count
        ]
