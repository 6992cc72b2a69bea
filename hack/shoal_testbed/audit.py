"""Follow the testbed API server's audit log (Metadata level: an entry when
each request is received and one when it was answered) from where it ends
now.

`freeze_at` is how a fault test stops a client right after one step: the
moment the API server logs that it answered the client's write, the client
is sent SIGSTOP, and the test then kills it. Polling the file every
millisecond, the stop lands within a few milliseconds of the answer: about
when the client reads it, before it gets much further."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.001


@dataclass(frozen=True)
class Request:
    """One audit entry, as much of it as tests match on."""

    audit_id: str  # one request's entries share it
    stage: str  # RequestReceived, ResponseComplete, ...
    verb: str  # create, patch, update, delete, get, list, watch
    user_agent: str
    resource: str
    name: str
    namespace: str
    subresource: str
    uri: str
    code: int | None  # the response's, from ResponseComplete on

    @classmethod
    def of(cls, entry: dict[str, Any]) -> Request:
        ref = entry.get("objectRef") or {}
        return cls(
            audit_id=str(entry.get("auditID", "")),
            stage=str(entry.get("stage", "")),
            verb=str(entry.get("verb", "")),
            user_agent=str(entry.get("userAgent", "")),
            resource=str(ref.get("resource", "")),
            name=str(ref.get("name", "")),
            namespace=str(ref.get("namespace", "")),
            subresource=str(ref.get("subresource", "")),
            uri=str(entry.get("requestURI", "")),
            code=(entry.get("responseStatus") or {}).get("code"),
        )

    @property
    def server_side_apply(self) -> bool:
        # SSA is a PATCH with force (shoal's), merge patches carry no force.
        return self.verb == "patch" and "force=true" in self.uri


class AuditTail:
    """The audit log from its end when made; `wait` reads on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""
        self._unread: list[Request] = []  # read from the file, not yet matched

    def _lines(self) -> list[Request]:
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        text = self._partial + chunk
        *whole, self._partial = text.split(b"\n")
        found = []
        for line in whole:
            try:
                found.append(Request.of(json.loads(line)))
            except ValueError:
                continue
        return found

    def wait(
        self,
        match: Callable[[Request], bool],
        *,
        what: str,
        timeout: float,
        then: Callable[[], None] | None = None,
    ) -> Request:
        """The first entry from here on that matches; `then` runs the moment
        it is read, before anything else."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._unread += self._lines()
            while self._unread:
                request = self._unread.pop(0)
                if match(request):
                    if then is not None:
                        then()
                    return request
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} in {self.path}")


def freeze_at(
    tail: AuditTail, pid: int, match: Callable[[Request], bool], *, what: str, timeout: float
) -> Request:
    """SIGSTOP pid the moment the API server has answered a request that
    matches (ResponseComplete). Not at RequestReceived: that is logged once
    the headers are in, and a client stopped then never sends the body."""
    return tail.wait(
        lambda request: request.stage == "ResponseComplete" and match(request),
        what=what,
        timeout=timeout,
        then=lambda: os.kill(pid, signal.SIGSTOP),
    )
