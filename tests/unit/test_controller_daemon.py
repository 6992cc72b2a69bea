"""The per-cluster daemon survives a pass that fails in a way nobody
foresaw (a bug in shoal, a field no check expected): it says so once in an
event and the log, keeps the cluster's memory, and tries again with backoff,
as it does for the API server's errors. Before, the exception ended the
daemon: kopf restarted it 60 s later, the cluster's health tracking and
warm-ups were dropped meanwhile, and `kubectl describe vlc` said nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest

from shoal.controller import handlers
from shoal.controller import reconcile as reconcile_module
from shoal.controller.context import ClusterState, ControllerSettings, OperatorContext
from shoal.controller.decide import Event, EventType
from shoal.controller.identity import ClusterRef
from shoal.controller.status import Refusal


class _Stop:
    """A daemon's `stopped` flag, set by the test."""

    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set


def _context(events: list[Event]) -> OperatorContext:
    """An operator whose Events, posted or recorded, land in `events`."""

    async def recorded(_: Any, event: Event) -> None:
        events.append(event)

    return OperatorContext(
        settings=ControllerSettings(router_image="shoal:test"),
        post_event=lambda _, event: events.append(event),
        record_event=recorded,
    )


def test_a_pass_that_raises_anything_is_reported_once_and_retried_with_the_clusters_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[Event] = []
    forgotten: list[object] = []

    ctx = _context(events)
    monkeypatch.setattr(ctx, "forget", lambda ref, *, deleted: forgotten.append(ref))
    memo: dict[str, Any] = {"shoal": ctx}
    body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", "uid": "u1"}, "spec": {}})
    stop = _Stop()
    seen: list[ClusterState] = []

    async def reconcile(_: Any, __: Any, state: ClusterState, ___: Any) -> float | None:
        seen.append(state)
        if len(seen) <= 2:
            raise KeyError("planted bug")
        stop.set = True
        return 0.0

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(handlers, "DEBOUNCE_SECONDS", 0.0)
    monkeypatch.setattr(handlers, "FIRST_BACKOFF_SECONDS", 0.01)

    async def run() -> None:
        await asyncio.wait_for(handlers.cluster_daemon(body, memo, stop), 10)  # type: ignore[arg-type]
        await ctx.engine.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2]  # one memory throughout
    warnings = [e for e in events if e.type == EventType.WARNING]
    assert len(warnings) == 1, events  # the same failure twice: said once
    assert warnings[0].reason == "ReconcileFailed"
    assert "KeyError" in warnings[0].message and "planted bug" in warnings[0].message
    assert forgotten == [ClusterRef.of(body)]  # only when the daemon ended
    tracebacks = [r for r in caplog.records if r.exc_info and "planted bug" in str(r.exc_info[1])]
    assert len(tracebacks) == 2  # the log has the traceback of each
    errors = ctx.metrics.passes.labels("ns", "c", "error")._value.get()
    assert errors == 2


def test_the_same_refused_write_is_reported_once_though_every_pass_meets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused child write (an invalid passed-through field) ends its pass
    normally, and every pass meets it again: one Warning, not one a pass."""
    events: list[Event] = []

    ctx = _context(events)
    monkeypatch.setattr(ctx, "forget", lambda ref, *, deleted: None)
    body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", "uid": "u1"}, "spec": {}})
    stop = _Stop()
    refusal = Refusal("StatefulSet c-r0", 422, 'limits[memory]: Invalid value: "80GB"')
    passes = 0

    async def reconcile(ctx_: Any, body_: Any, state: ClusterState, _: Any) -> float | None:
        nonlocal passes
        passes += 1
        await reconcile_module._report_refusals(ctx_, body_, state, (refusal,))
        stop.set = passes == 5
        return 0.0

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(handlers, "DEBOUNCE_SECONDS", 0.0)

    async def run() -> None:
        await asyncio.wait_for(handlers.cluster_daemon(body, {"shoal": ctx}, stop), 10)  # type: ignore[arg-type]
        await ctx.engine.aclose()

    asyncio.run(run())
    assert passes == 5
    refused = [e for e in events if e.type == EventType.WARNING]
    assert len(refused) == 1, events
    assert "80GB" in refused[0].message
