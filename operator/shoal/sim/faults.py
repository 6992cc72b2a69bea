"""Fault injection: what a broken engine looks like from outside.

Set at start by `--sim-*` flags and, when `--sim-fault-api` is given, changed
at run time by `POST /_sim/fault` with a JSON object of the fields below.
Two keys of that body are actions rather than faults in force: `"crash":
true`, and `"refuse_seconds": N`, which closes the engine's listening socket
for N wall seconds (connections are refused, as by a process that is gone,
while the streams already open carry on), then listens again on the same
port: the fault API is unreachable meanwhile, so the fault lifts itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

METRICS_MODES = ("ok", "error", "garbage", "hang", "nan", "negative", "endless")
CONNECTION_MODES = ("ok", "reset", "silent")
# Requests to this path pass a "reset" fault, so it can be lifted again.
FAULT_PATH = "/_sim/fault"


@dataclass
class Faults:
    # The engine stops stepping (a stuck kernel, a deadlock): requests hang,
    # /health still answers 200, as real vLLM's does.
    hang: bool = False
    # Fraction of generation requests answered 500 at once.
    error_rate: float = 0.0
    # Every step takes this many times longer.
    slowness: float = 1.0
    # /metrics: "ok", "error" (500), "garbage" (not Prometheus text), "hang"
    # (never answers), "nan" (well-formed, every value NaN: an exporter that
    # lies, as a gauge set from a division by zero would), "negative" (every
    # value below zero: gauges decremented without their increments) or
    # "endless" (the scrape, then comment lines without end, as fast as they
    # are read: a runaway exporter, which a reader must not hold whole).
    metrics: str = "ok"
    # Connections: "ok", or "reset": every request but those to /_sim/fault
    # is answered by a TCP reset (RST) and no response, as when the network
    # path to the engine is cut (a firewall's reject-with-tcp-reset, a lost
    # route): a connection-level error for every client, not an HTTP status;
    # or "silent": every such request is read and never answered, as through
    # a path that drops packets (a blackholed route): clients time out.
    connections: str = "ok"
    # Requests whose body holds this text are answered 500 at once, on every
    # engine given it: a failure caused by the request, not the engine (as
    # vLLM's on some prompts). Empty: off.
    poison: str = ""
    # Streams stop after this many chunks and hang, while /health and other
    # requests carry on (a wedged request, a lost GPU stream). 0: off.
    stall_after: int = 0
    # /metrics blocks the engine's event loop this many wall seconds per
    # render, as on a CPU-starved engine (vLLM renders its exposition on its
    # API server's loop): scrapes then cost the engine its serving time. 0: off.
    metrics_seconds: float = 0.0

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a /_sim/fault body; ValueError names the first bad field."""
        known = {f.name for f in fields(self)}
        for key in changes:
            if key not in known:
                raise ValueError(f"unknown fault {key!r}; known: {sorted(known)}")
        merged = Faults(**{**asdict(self), **changes})
        merged.validate()
        for key in changes:
            setattr(self, key, getattr(merged, key))

    def validate(self) -> None:
        if not isinstance(self.hang, bool):
            raise ValueError("hang must be true or false")
        if not isinstance(self.error_rate, int | float) or not 0 <= self.error_rate <= 1:
            raise ValueError("error_rate must be a number from 0 to 1")
        if not isinstance(self.slowness, int | float) or self.slowness <= 0:
            raise ValueError("slowness must be a number above 0")
        if self.metrics not in METRICS_MODES:
            raise ValueError(f"metrics must be one of {', '.join(METRICS_MODES)}")
        if self.connections not in CONNECTION_MODES:
            raise ValueError(f"connections must be one of {', '.join(CONNECTION_MODES)}")
        if not isinstance(self.poison, str):
            raise ValueError("poison must be a string")
        if not isinstance(self.stall_after, int) or self.stall_after < 0:
            raise ValueError("stall_after must be a whole number of chunks, 0 for off")
        if (
            isinstance(self.metrics_seconds, bool)
            or not isinstance(self.metrics_seconds, int | float)
            or not 0 <= self.metrics_seconds <= 60
        ):
            raise ValueError("metrics_seconds must be a number of seconds from 0 to 60")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def refuse_seconds(value: Any) -> float:
    """A /_sim/fault body's `refuse_seconds`, checked: ValueError if bad."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ValueError("refuse_seconds must be a number of seconds above 0, at most 3600")
    return float(value)
