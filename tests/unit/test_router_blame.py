"""Two replicas' server errors blame the request only when they say the
same thing, in vLLM's shape, and it is not the engine's state."""

from __future__ import annotations

import json

from shoal.router.blame import the_requests_failure


def said(message: str, kind: str = "InternalServerError", status: int = 500) -> tuple[int, bytes]:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return status, json.dumps(body).encode()


def test_the_same_error_from_two_replicas_is_the_requests() -> None:
    poison = said("Simulated request error (poison)")
    assert the_requests_failure(poison, poison)


def test_different_errors_or_statuses_are_each_replicas_own() -> None:
    assert not the_requests_failure(said("one thing"), said("another"))
    assert not the_requests_failure(said("x"), said("x", status=503))


def test_engines_dead_or_shutting_down_are_never_the_requests() -> None:
    dead = said("EngineCore encountered an issue. See stack trace (above) for the root cause.")
    assert not the_requests_failure(dead, dead)
    dead_kind = said("gone", kind="EngineDeadError")
    assert not the_requests_failure(dead_kind, dead_kind)
    draining = said("cannot schedule new futures after shutdown")
    assert not the_requests_failure(draining, draining)


def test_answers_not_in_vllms_shape_are_no_proof() -> None:
    # vLLM answers a dead engine core's requests with a bare 500.
    assert not the_requests_failure((500, b""), (500, b""))
    assert not the_requests_failure(
        (502, b"<html>bad gateway</html>"), (502, b"<html>bad gateway</html>")
    )
