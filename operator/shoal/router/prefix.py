"""Prompt rendering and prefix-block hashing.

The router cannot see the engine's tokens, so it hashes text: the rendered
prompt cut into blocks of `block_chars` characters (64 by default, about 16
tokens, vLLM's GPU block size), each hash chained over everything before it,
as vLLM chains its block hashes. Equal hashes therefore mean equal prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

from shoal.router.config import RouterConfig
from shoal.router.policy import RequestFacts


def render_prompt(body: dict[str, Any]) -> str:
    """The text the engine will see first, as far as the router can tell:
    a completion's prompt, or the chat messages in order with their roles."""
    if "messages" in body:
        parts = []
        for message in body.get("messages") or []:
            if not isinstance(message, dict):
                continue
            parts.append(f"<{message.get('role', '')}>{_content_text(message.get('content'))}")
        return "\n".join(parts)
    prompt = body.get("prompt", "")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        # Token ids: their text form hashes just as well.
        return " ".join(str(t) for t in (first if isinstance(first, list) else prompt))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


@dataclass(frozen=True)
class PrefixKey:
    """A prompt's prefix as the router tracks it: chained hashes at the
    checkpoint blocks (see `checkpoints`) and how many whole blocks it has."""

    hashes: list[int]
    blocks: int

    def held_share(self, checkpoints_held: int) -> float:
        """Share of the prompt's blocks covered by its first `checkpoints_held`
        checkpoints."""
        if not checkpoints_held or not self.blocks:
            return 0.0
        return min(CHECKPOINTS[checkpoints_held - 1] + 1, self.blocks) / self.blocks


def checkpoints(max_blocks: int) -> list[int]:
    """Block indices whose chained hash is kept: every block of the first 16,
    then 8 per doubling (every 2nd up to 32, every 4th up to 64, ...). A
    prefix match is then known to within 1/8 of its length while a prompt of
    256 blocks costs 48 hashes and index lookups instead of 256; this is what
    keeps the decision within its budget. The positions are absolute, so every
    prompt sharing a prefix shares its checkpoint hashes."""
    positions = []
    for block in range(max_blocks):
        if block < 16:
            positions.append(block)
            continue
        step = 1 << (block.bit_length() - 4)  # 2 for 16..31, 4 for 32..63, ...
        if (block + 1) % step == 0:
            positions.append(block)
    return positions


CHECKPOINTS = checkpoints(1 << 16)


def prefix_key(text: str, *, block_chars: int, max_blocks: int) -> PrefixKey:
    """Chained hashes of the prompt's whole blocks (a partial last block is not
    cacheable, as in vLLM), kept at the checkpoint blocks."""
    count = min(len(text) // block_chars, max_blocks)
    data = text.encode("utf-8", "surrogatepass")
    ascii_only = len(data) == len(text)  # then byte offsets are character offsets
    hasher = xxhash.xxh3_64()
    hashes = []
    done = 0
    for block in CHECKPOINTS:
        if block >= count:
            break
        end = (block + 1) * block_chars
        # One update per run of blocks: only the checkpoints need a digest.
        if ascii_only:
            hasher.update(data[done * block_chars : end])
        else:
            hasher.update(text[done * block_chars : end].encode("utf-8", "surrogatepass"))
        hashes.append(hasher.intdigest())
        done = block + 1
    return PrefixKey(hashes=hashes, blocks=count)


def hash_text(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def request_facts(
    prompt: str, key: PrefixKey, config: RouterConfig, *, session_key: int | None = None
) -> RequestFacts:
    """What the policies know of a request: its affinity key (first prefix
    block, or the whole prompt when shorter than a block) and its size."""
    per_token = config.thresholds.chars_per_token
    return RequestFacts(
        affinity_key=key.hashes[0] if key.hashes else hash_text(prompt),
        session_key=session_key,
        prompt_tokens=len(prompt) / per_token,
        prefix_tokens=key.blocks * config.thresholds.prefix_block_chars / per_token,
    )
