"""Prompt rendering and prefix-block hashing.

The router cannot see the engine's tokens, so it hashes text: the rendered
prompt cut into blocks of `block_chars` characters (64 by default, about 16
tokens, vLLM's GPU block size), each hash chained over everything before it,
as vLLM chains its block hashes. Equal hashes therefore mean equal prefixes.
"""

from __future__ import annotations

from typing import Any

import xxhash


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


def block_hashes(text: str, *, block_chars: int, max_blocks: int) -> list[int]:
    """Chained hashes of the prompt's whole blocks (a partial last block is not
    cacheable, as in vLLM)."""
    hasher = xxhash.xxh3_64()
    hashes = []
    data = text.encode("utf-8", "surrogatepass")
    # Cut on characters, hash bytes: multi-byte text still gets stable blocks.
    count = min(len(text) // block_chars, max_blocks)
    if len(data) == len(text):  # ASCII: byte offsets are character offsets
        for i in range(count):
            hasher.update(data[i * block_chars : (i + 1) * block_chars])
            hashes.append(hasher.intdigest())
        return hashes
    for i in range(count):
        hasher.update(
            text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass")
        )
        hashes.append(hasher.intdigest())
    return hashes
