"""How long a plain answer is waited for.

vLLM writes a plain (not streamed) answer's head with its body, once it is
all generated, so the head of a long generation comes long after
timeouts.firstByteSeconds. A hung engine sends nothing either. What tells
them apart is the engine's progress (tokens generated plus steps taken,
`MetricsSnapshot.progress`), as the router's scrapes read it: while it
moves, the wait goes on a firstByteSeconds at a time, up to totalSeconds;
once a step passes with it flat (or unknown: scrapes failing), the engine
is taken as hung, and the request is retried elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Progress:
    """read: the engine's progress counter as last scraped (None: unknown);
    clock: the loop's time, which step and deadline are in."""

    read: Callable[[], float | None]
    clock: Callable[[], float]
    step: float
    deadline: float
    _seen: float | None = field(init=False)

    def __post_init__(self) -> None:
        self._seen = self.read()

    def extend(self) -> float | None:
        """At a wait's end: when the next one ends if the engine progressed
        since the last look, else None (it gives up)."""
        before, self._seen = self._seen, self.read()
        moved = before is not None and self._seen is not None and self._seen > before
        now = self.clock()
        later = min(now + self.step, self.deadline)
        return later if moved and later > now else None
