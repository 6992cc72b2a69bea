"""Warm-up prompts: plain text or chat messages, from the VLLMCluster spec, a
ConfigMap, the router's hot prefixes, or a file; bounded in count and size."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.api.spec import WARMUP_PROMPT_CHARS, WARMUP_PROMPT_MESSAGES
from shoal.engine import endpoints
from shoal.router.shapes import Shape, chat_form

# As inline prompts may be (ConfigMap keys and hot prefixes are cut to it).
MAX_PROMPT_CHARS = WARMUP_PROMPT_CHARS


@dataclass(frozen=True)
class Prompt:
    """One warm-up request: `text` for /v1/completions, or `messages` for
    /v1/chat/completions."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None

    def request(self, model: str) -> tuple[str, dict[str, Any]]:
        """The endpoint path and body that warm this prompt: one token out,
        so the engine's work is the prefill that fills the cache."""
        if self.messages is not None:
            return endpoints.CHAT_COMPLETIONS, {
                "model": model,
                "messages": [{"role": r, "content": c} for r, c in self.messages],
                "max_tokens": 1,
            }
        return endpoints.COMPLETIONS, {"model": model, "prompt": self.text or "", "max_tokens": 1}

    @property
    def size(self) -> int:
        if self.messages is not None:
            return sum(len(c) for _, c in self.messages)
        return len(self.text or "")

    def cut(self, max_chars: int) -> Prompt:
        """At most max_chars of text: a plain prompt's head, or a chat's
        leading messages, the last of them cut. A prefix still warms the
        cache its whole would have started."""
        if self.size <= max_chars:
            return self
        if self.messages is None:
            return Prompt(text=(self.text or "")[:max_chars])
        kept, room = [], max_chars
        for role, content in self.messages:
            if room <= 0:
                break
            kept.append((role, content[:room]))
            room -= len(kept[-1][1])
        return Prompt(messages=tuple(kept))


# What one prompt object may span as YAML gives it (an alias counted at each
# use): a chat's messages with their text parts, and their text. Past it the
# object is refused, not cut: aliases made a 64 KB key into gigabytes of text.
MAX_OBJECT_NODES = WARMUP_PROMPT_MESSAGES * 64
MAX_OBJECT_CHARS = WARMUP_PROMPT_MESSAGES * MAX_PROMPT_CHARS


def _within_bounds(item: Any) -> None:
    nodes = chars = 0
    pending = [item]
    while pending:
        value = pending.pop()
        nodes += 1
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        if nodes > MAX_OBJECT_NODES or chars > MAX_OBJECT_CHARS:
            raise ValueError(
                f"a warm-up prompt object is too large (more than {MAX_OBJECT_NODES} values "
                f"or {MAX_OBJECT_CHARS} characters, YAML aliases counted at each use)"
            )


def from_object(item: Any) -> Prompt:
    """A prompt from `{"prompt": ...}`, `{"text": ...}`, `{"messages": [...]}`, a
    Responses request (`instructions`, `input`) or a Messages one (`system`,
    `messages`)."""
    if isinstance(item, str):
        return Prompt(text=item)
    if not isinstance(item, dict):
        raise ValueError(f"a warm-up prompt must be a string or an object, not {item!r:.60}")
    if "input" in item or "system" in item:
        # A Responses or Messages request: the engine renders it with the chat
        # template, so its chat form warms the cache those requests hit.
        _within_bounds(item)  # its text parts are joined before any cut
        shape = Shape.RESPONSES if "input" in item else Shape.MESSAGES
        item = chat_form(shape, item) or {}
    if "messages" in item and item["messages"] is not None:
        messages = item["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list of {role, content}")
        if len(messages) > WARMUP_PROMPT_MESSAGES:
            raise ValueError(f"a warm-up prompt has at most {WARMUP_PROMPT_MESSAGES} messages")
        pairs = []
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                raise ValueError("each message needs a string 'content'")
            pairs.append((str(message.get("role", "user")), message["content"]))
        return Prompt(messages=tuple(pairs))
    text = item.get("prompt", item.get("text"))
    if not isinstance(text, str):
        raise ValueError("a warm-up prompt object needs 'prompt' (or 'text') or 'messages'")
    return Prompt(text=text)


def parse_lines(content: str, *, jsonl: bool) -> list[Prompt]:
    """One plain-text prompt per line, or one JSON object per line."""
    prompts = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(text=line))
            continue
        try:
            prompts.append(from_object(json.loads(line)))
        except (json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"line {number}: {error}") from error
    return prompts


def load_file(path: Path) -> list[Prompt]:
    return parse_lines(path.read_text(), jsonl=path.suffix == ".jsonl")


def combine(sources: Iterable[Iterable[Prompt]], *, max_prompts: int) -> list[Prompt]:
    """Sources in order of preference, duplicates and empty prompts dropped,
    over-long prompts cut, at most max_prompts in all."""
    seen: set[Prompt] = set()
    out: list[Prompt] = []
    for source in sources:
        for prompt in source:
            if prompt.size == 0:
                continue
            prompt = prompt.cut(MAX_PROMPT_CHARS)
            if prompt in seen:
                continue
            seen.add(prompt)
            out.append(prompt)
            if len(out) >= max_prompts:
                return out
    return out
