"""Log records with cluster, replica and pod context, both in the message
(`cluster=ns/name replica=2 pod=x-r2-0 ...`) and as record attributes."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

log = logging.getLogger("shoal.controller")


class ContextLogger(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        context = self.extra or {}
        prefix = " ".join(f"{key}={value}" for key, value in context.items() if value is not None)
        kwargs["extra"] = {**context, **kwargs.get("extra", {})}
        return f"{prefix} {msg}", kwargs


def cluster_logger(
    namespace: str, name: str, *, replica: int | None = None, pod: str | None = None
) -> ContextLogger:
    return ContextLogger(log, {"cluster": f"{namespace}/{name}", "replica": replica, "pod": pod})
