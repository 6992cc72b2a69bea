"""Replayed traces: one JSON object per line,

    {"timestamp": 12.5, "messages": [{"role": "user", "content": "..."}], "output_tokens": 128}
    {"timestamp": 12.9, "prompt": "...", "output_tokens": 64, "user": "u7", "group": "batch"}

`timestamp` is in seconds (any origin: the first request is sent at 0),
`output_tokens` (or `max_tokens`) the output length to ask for; `user` and
`group` are optional. Requests are replayed in timestamp order, at their
offsets from the first one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shoal.bench.workloads import BenchRequest, Message, Workload


class TraceError(ValueError):
    pass


def parse_trace(lines: Iterable[str]) -> list[BenchRequest]:
    entries: list[tuple[float, int, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"line {number}: not JSON: {error}") from error
        if not isinstance(entry, dict):
            raise TraceError(f"line {number}: expected a JSON object")
        timestamp = entry.get("timestamp")
        if not isinstance(timestamp, int | float) or isinstance(timestamp, bool):
            raise TraceError(f"line {number}: `timestamp` must be a number of seconds")
        entries.append((float(timestamp), number, entry))
    if not entries:
        return []
    entries.sort(key=lambda e: (e[0], e[1]))
    start = entries[0][0]
    return [
        _request(index, number, entry, at=timestamp - start)
        for index, (timestamp, number, entry) in enumerate(entries)
    ]


def _request(index: int, number: int, entry: dict[str, Any], *, at: float) -> BenchRequest:
    output = entry.get("output_tokens", entry.get("max_tokens"))
    if not isinstance(output, int) or isinstance(output, bool) or output < 1:
        raise TraceError(f"line {number}: `output_tokens` must be a positive integer")
    user = entry.get("user")
    group = entry.get("group", "all")
    if user is not None and not isinstance(user, str):
        raise TraceError(f"line {number}: `user` must be a string")
    if not isinstance(group, str):
        raise TraceError(f"line {number}: `group` must be a string")
    prompt = entry.get("prompt")
    messages = entry.get("messages")
    if (prompt is None) == (messages is None):
        raise TraceError(f"line {number}: give either `prompt` or `messages`")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            raise TraceError(f"line {number}: `prompt` must be a non-empty string")
        return BenchRequest(
            index=index, prompt=prompt, max_tokens=output, user=user, group=group, at=at
        )
    return BenchRequest(
        index=index,
        messages=_messages(number, messages),
        max_tokens=output,
        user=user,
        group=group,
        at=at,
    )


def _messages(number: int, messages: Any) -> tuple[Message, ...]:
    if not isinstance(messages, list) or not messages:
        raise TraceError(f"line {number}: `messages` must be a non-empty list")
    out: list[Message] = []
    for message in messages:
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise TraceError(f"line {number}: each message needs a string `role` and `content`")
        out.append((message["role"], message["content"]))
    return tuple(out)


def load_trace(path: Path, *, count: int | None = None) -> Workload:
    with path.open(encoding="utf-8") as lines:
        requests = parse_trace(lines)
    if count is not None:
        requests = requests[:count]
    groups = tuple(sorted({r.group for r in requests})) or ("all",)
    params: dict[str, object] = {"name": "trace", "path": str(path), "requests": len(requests)}
    return Workload(name="trace", params=params, requests=tuple(requests), groups=groups)
