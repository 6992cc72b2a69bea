"""How one model is spread over GPUs: tensor, pipeline, data and decode-context parallel."""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import ceil

_PART = re.compile(r"(dcp|tp|pp|dp)(\d+)")
_SEPARATORS = re.compile(r"[\sx*_-]+")


@dataclass(frozen=True)
class Layout:
    """One replica is `tensor x pipeline` GPUs; `data` replicas run side by side.
    Decode context parallel reuses the tensor-parallel ranks and adds no GPUs."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    decode_context: int = 1

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor * self.pipeline

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.data

    def nodes_per_replica(self, gpus_per_node: int) -> int:
        return ceil(self.gpus_per_replica / gpus_per_node)

    @property
    def name(self) -> str:
        """`TP4xPP2`, `TP8xDCP2`, `TP4xDP2`: the parts that are not 1, TP always."""
        parts = [f"TP{self.tensor}"]
        parts += [f"PP{self.pipeline}"] if self.pipeline != 1 else []
        parts += [f"DCP{self.decode_context}"] if self.decode_context != 1 else []
        parts += [f"DP{self.data}"] if self.data != 1 else []
        return "x".join(parts)


def parse_layout(text: str) -> Layout:
    """`tp8`, `tp4pp2`, `TP4xDP2`, `tp8-dcp2`: each of tp/pp/dp/dcp at most once."""
    compact = _SEPARATORS.sub("", text.lower())
    sizes: dict[str, int] = {}
    position = 0
    for match in _PART.finditer(compact):
        if match.start() != position:
            break
        kind, size = match.group(1), int(match.group(2))
        if kind in sizes:
            raise ValueError(f"layout {text!r} gives {kind} twice")
        if size < 1:
            raise ValueError(f"layout {text!r}: {kind} must be at least 1")
        sizes[kind] = size
        position = match.end()
    if not sizes or position != len(compact):
        raise ValueError(
            f"layout {text!r} is not a layout: write parts like tp8, tp4pp2, tp4dp2 or tp8dcp2"
        )
    return Layout(
        tensor=sizes.get("tp", 1),
        pipeline=sizes.get("pp", 1),
        data=sizes.get("dp", 1),
        decode_context=sizes.get("dcp", 1),
    )
