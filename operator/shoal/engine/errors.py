"""What can go wrong asking an engine something, as types: callers tell a
dead engine (no HTTP answer) from a hung one (no answer in time) from one
that answered an error or something that is not what the endpoint gives."""

from __future__ import annotations

from shoal.engine.endpoints import ErrorBody, parse_error


class EngineError(Exception):
    """An engine call that did not give what was asked."""


class Unreachable(EngineError):
    """No HTTP answer: refused (vLLM refuses connections while it loads),
    reset, or cut short."""


class TimedOut(EngineError):
    """No whole answer within the call's deadline."""


class ErrorStatus(EngineError):
    """An HTTP error status; `error` is vLLM's error body when it sent one."""

    def __init__(self, *, path: str, status: int, text: str) -> None:
        self.path = path
        self.status = status
        self.text = text
        self.error: ErrorBody | None = parse_error(text)
        super().__init__(f"{path} answered {status}: {text[:200]}")


class BadAnswer(EngineError):
    """A 200 answer that is not what the endpoint gives."""


class BadMetrics(BadAnswer):
    """A `/metrics` text that is not a whole vLLM scrape: not Prometheus text,
    no vLLM metrics, or cut short. Never read as an idle engine."""
