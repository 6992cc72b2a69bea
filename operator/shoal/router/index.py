"""Which prefix blocks each replica is believed to hold.

Learned from routing decisions: the blocks of a request routed to a replica
are assumed cached there. One map from block hash to a bitmask of replica
slots answers "how deep does each replica match this prompt" with one lookup
per block, whatever the fleet size; a per-replica LRU bounds memory and
forgets blocks the engine has likely evicted too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    def __init__(self, *, blocks_per_replica: int) -> None:
        self.blocks_per_replica = blocks_per_replica
        self._slot: dict[str, int] = {}
        self._replica_at: dict[int, str] = {}
        self._owners: dict[int, int] = {}  # block hash -> bitmask of slots
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def replicas(self) -> list[str]:
        return list(self._slot)

    def add_replica(self, replica: str) -> None:
        if replica in self._slot:
            return
        slot = next(i for i in range(len(self._slot) + 1) if i not in self._replica_at)
        self._slot[replica] = slot
        self._replica_at[slot] = replica
        self._lru[replica] = OrderedDict()

    def remove_replica(self, replica: str) -> None:
        """Forget a replica (gone, or restarted: a new pod starts cold)."""
        slot = self._slot.pop(replica, None)
        if slot is None:
            return
        del self._replica_at[slot]
        clear = ~(1 << slot)
        for block in self._lru.pop(replica):
            remaining = self._owners[block] & clear
            if remaining:
                self._owners[block] = remaining
            else:
                del self._owners[block]

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        slot = self._slot.get(replica)
        if slot is None:
            return
        bit = 1 << slot
        lru = self._lru[replica]
        owners = self._owners
        # Tail first, head last: the head ends most recently used, so the LRU
        # evicts a prompt's tail before its prefix, as vLLM's free queue does.
        for block in reversed(blocks):
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                owners[block] = owners.get(block, 0) | bit
        while len(lru) > self.blocks_per_replica:
            old, _ = lru.popitem(last=False)
            remaining = owners[old] & ~bit
            if remaining:
                owners[old] = remaining
            else:
                del owners[old]

    def depth(self, replica: str, blocks: Sequence[int]) -> int:
        """Leading blocks of the prompt one replica holds (its `match`)."""
        slot = self._slot.get(replica)
        if slot is None:
            return 0
        bit, owners = 1 << slot, self._owners
        for i, block in enumerate(blocks):
            if not owners.get(block, 0) & bit:
                return i
        return len(blocks)

    def match(self, blocks: Sequence[int]) -> dict[str, int]:
        """Leading blocks (checkpoints) of the prompt each replica holds
        (replicas holding none are left out)."""
        depth: dict[str, int] = {}
        alive = -1
        owners = self._owners
        for i, block in enumerate(blocks):
            held = owners.get(block, 0) & alive
            if alive != -1:
                dropped = alive & ~held
                while dropped:
                    low = dropped & -dropped
                    if i:
                        depth[self._replica_at[low.bit_length() - 1]] = i
                    dropped ^= low
            alive = held
            if not alive:
                return depth
        while alive > 0:
            low = alive & -alive
            depth[self._replica_at[low.bit_length() - 1]] = len(blocks)
            alive ^= low
        return depth
