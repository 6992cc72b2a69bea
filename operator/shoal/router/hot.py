"""The most shared prompt prefixes, for warm-up (off by default: prompts may
be private). A space-saving top-K sketch, so memory stays bounded however
many distinct prompts pass.

A prefix is kept in the form the request had, because that is what the engine
caches: it applies its chat template to `messages`, so the router's rendered
text of a chat request, sent back as a plain prompt, fills blocks that no chat
request ever hits. Completions count text prefixes of 1, 2, 4, ... blocks;
chat requests count their leading messages (the system message, the first k
messages), as messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from shoal.router.prefix import CHECKPOINTS, PrefixKey

_CHECKPOINT_INDEX = {block: i for i, block in enumerate(CHECKPOINTS)}
# Leading messages counted per chat request, at most.
MAX_CHAT_MESSAGES = 16
# Request fields that change what the chat template renders: a prefix of such
# a request cannot be reproduced from its messages alone, so it is not kept.
_TEMPLATE_INPUTS = ("tools", "functions", "documents", "chat_template", "chat_template_kwargs")
# Message fields the warm-up sends; a message with any other set (name, tool
# calls) renders differently without it, so counting stops there.
_PLAIN_FIELDS = frozenset({"role", "content"})
_MAX_ROLE_CHARS = 32
# Enough of a message to tell one conversation from another.
_MESSAGE_HEAD_CHARS = 1024
# Chat keys and text keys share one table: a different seed keeps them apart.
_CHAT_SEED = 0x5C4A7


@dataclass
class _Entry:
    text: str | None
    messages: tuple[tuple[str, str], ...] | None
    size: int  # characters: of the text, or of the messages' contents
    count: int
    error: int
    # Chat: where the last request with this prefix ended (its last message's
    # position and hash). A conversation's next turn repeats that message at
    # that position; it does not count again, or one long conversation would
    # make its own history hot. Requests that share the prefix otherwise count.
    last_at: int = 0
    last: int = 0


class HotPrefixes:
    def __init__(self, *, top_k: int, max_chars: int, block_chars: int) -> None:
        self.capacity = top_k * 4  # track more than reported, as space-saving advises
        self.top_k = top_k
        self.max_chars = max_chars
        self.block_chars = block_chars
        self._entries: dict[int, _Entry] = {}
        # Keys by count, and the least count: a count only ever grows by one,
        # so when the least count's keys are gone the next count has some,
        # and finding a victim costs O(1), not a scan of the table.
        self._by_count: dict[int, dict[int, None]] = {}
        self._least = 0

    def observe(self, text: str, key: PrefixKey, body: Mapping[str, Any] | None = None) -> None:
        """Count the request's prefixes: its leading messages for chat (`body`
        with `messages`), else the text's first 1, 2, 4, ... blocks."""
        if body is not None:
            if "messages" in body:
                self._observe_chat(body)
                return
            prompt = body.get("prompt")
            if not (
                isinstance(prompt, str)
                or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str))
            ):
                return  # token ids: their text form would warm nothing
        self._observe_text(text, key)

    def _observe_text(self, text: str, key: PrefixKey) -> None:
        """Blocks 2^k - 1 are always checkpoints, so their hashes are at hand."""
        depth = 1
        while depth <= key.blocks and depth * self.block_chars <= self.max_chars:
            end = depth * self.block_chars
            digest = key.hashes[_CHECKPOINT_INDEX[depth - 1]]
            entry = self._entries.get(digest)
            if entry is not None:
                self._bump(digest, entry)
            else:
                self._insert(digest, text[:end], None, end)
            depth *= 2

    def _observe_chat(self, body: Mapping[str, Any]) -> None:
        """The first 1, 2, ... messages (never all of them: the last is what
        this request asks), their contents up to max_chars in all, the last
        one cut there. Hashing reads each counted character once, plus the
        heads of the last message and of one earlier message per prefix."""
        if any(name in body for name in _TEMPLATE_INPUTS):
            return
        messages = body["messages"]
        if not isinstance(messages, list):
            return
        last_at = len(messages) - 1
        last = _message_hash(messages[last_at]) if last_at > 0 else 0
        chain = xxhash.xxh3_64(seed=_CHAT_SEED)
        room = self.max_chars
        kept: list[tuple[str, str]] = []
        for i in range(min(last_at, MAX_CHAT_MESSAGES)):
            plain = _plain(messages[i])
            if plain is None:
                return
            role, content = plain
            cut = content[:room]
            chain.update(f"{role}\0{len(cut)}\0".encode())
            chain.update(cut.encode("utf-8", "surrogatepass"))
            kept.append((role, cut))
            room -= len(cut)
            if room == self.max_chars:
                continue  # an empty prefix warms nothing
            digest = chain.intdigest()
            entry = self._entries.get(digest)
            if entry is None:
                # A longer prefix is rarely known when this one is not: one
                # new entry per request, so a conversation's history enters
                # a message per turn (and leaves first), not all at once.
                entry = self._insert(digest, None, tuple(kept), self.max_chars - room)
                entry.last_at, entry.last = last_at, last
                return
            if not (
                entry.last_at < last_at and _message_hash(messages[entry.last_at]) == entry.last
            ):
                self._bump(digest, entry)
            entry.last_at, entry.last = last_at, last
            if room == 0:
                return

    def _bump(self, key: int, entry: _Entry) -> None:
        keys = self._by_count[entry.count]
        del keys[key]
        if not keys:
            del self._by_count[entry.count]
            if entry.count == self._least:
                self._least += 1
        entry.count += 1
        self._by_count.setdefault(entry.count, {})[key] = None

    def _insert(
        self,
        key: int,
        text: str | None,
        messages: tuple[tuple[str, str], ...] | None,
        size: int,
    ) -> _Entry:
        floor = 0
        if len(self._entries) >= self.capacity:
            # Space-saving: the newcomer takes the place, and the count, of
            # the least counted (the oldest among them).
            floor = self._least
            keys = self._by_count[floor]
            victim = next(iter(keys))
            del keys[victim]
            del self._entries[victim]
            if not keys:
                del self._by_count[floor]
        entry = self._entries[key] = _Entry(text, messages, size, floor + 1, floor)
        self._by_count.setdefault(floor + 1, {})[key] = None
        if floor not in self._by_count:  # no count is below the newcomer's
            self._least = floor + 1
        return entry

    def top(self, *, min_count: int = 2) -> list[dict[str, object]]:
        """Longest-first among the most counted: a longer shared prefix warms
        more. Each entry has `prompt` (completions) or `messages` (chat)."""
        ranked = sorted(self._entries.values(), key=lambda e: (e.count, e.size), reverse=True)
        return [_public(e) for e in ranked[: self.top_k] if e.count - e.error >= min_count]


def _plain(message: Any) -> tuple[str, str] | None:
    """(role, content) of a message the warm-up can send as it came, else None."""
    if not isinstance(message, dict):
        return None
    if not message.keys() <= _PLAIN_FIELDS and any(
        value is not None for name, value in message.items() if name not in _PLAIN_FIELDS
    ):
        return None
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or len(role) > _MAX_ROLE_CHARS or not isinstance(content, str):
        return None
    return role, content


def _message_hash(message: Any) -> int:
    """A hash of a message's role and the head of its content."""
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: the first one tells enough
        content = content[0].get("text") if content and isinstance(content[0], dict) else None
    head = content[:_MESSAGE_HEAD_CHARS] if isinstance(content, str) else ""
    role = message.get("role")
    role = role[:_MAX_ROLE_CHARS] if isinstance(role, str) else ""
    return xxhash.xxh3_64_intdigest(f"{role}\0{head}".encode("utf-8", "surrogatepass"))


def _public(entry: _Entry) -> dict[str, object]:
    if entry.messages is not None:
        return {
            "messages": [{"role": r, "content": c} for r, c in entry.messages],
            "count": entry.count,
        }
    return {"prompt": entry.text, "count": entry.count}
