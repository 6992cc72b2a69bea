"""The arithmetic of verification, and its verdicts. Pure.

vLLM counts prefix-cache hits in tokens, in whole blocks, and never hits a
prompt's last token (it must be computed to produce the first output token).
So a prompt of n tokens whose blocks are all cached hits floor((n - 1) / B) * B
tokens for block size B: with 128-token blocks (vLLM on CPU) a 600-token prompt
hits 512, a 512-token prompt 384.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum


class Verdict(StrEnum):
    """What a warm-up found; the operator admits or holds a replica on it."""

    WARM = "Warm"
    NOT_WARM = "NotWarm"  # verified below the ratio until the deadline
    TIMEOUT = "Timeout"  # the deadline passed before a verification finished
    UNREACHABLE = "Unreachable"
    NOTHING_TO_VERIFY = "NothingToVerify"  # no prompt spans a whole block


def expected_hits(prompt_tokens: int, block_size: int) -> int:
    if prompt_tokens <= 0 or block_size <= 0:
        return 0
    return (prompt_tokens - 1) // block_size * block_size


def replay_sample(count: int, *, size: int) -> list[int]:
    """Indices of the prompts to replay: the earliest ones first (a set that
    overflowed the cache loses those first, as LRU evicts them), then evenly
    spread over the rest."""
    if count <= size:
        return list(range(count))
    head = max(1, size // 2)
    rest = size - head
    picks = list(range(head))
    if rest:
        step = (count - head) / rest
        picks += [head + int(i * step) for i in range(rest)]
    return sorted(set(picks))


def hit_ratio(observed_hits: float, expected: Sequence[int]) -> float | None:
    """Observed over expected hit tokens; None when nothing could hit (every
    sampled prompt shorter than one block plus a token)."""
    total = sum(expected)
    if total == 0:
        return None
    return min(observed_hits / total, 1.0)
