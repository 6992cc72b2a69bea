"""Whose failure a server error is: the request's or its replica's.

The router retries a 5xx on another replica; a second replica's 5xx for the
same request makes it the request's (a prompt that breaks the engine's
tokenizer fails everywhere), and the error goes back to its client without
counting against either replica. Two replicas may fail at once for their
own reasons too (engine cores dead, servers shutting down in a rollout or a
node drain), so the two answers must say the same thing, in vLLM's error
shape, and that thing must not be the engine's state.
"""

from __future__ import annotations

from shoal.engine.endpoints import parse_error

# vLLM's words for an engine that cannot serve anyone: its executor shut
# down (SIGTERM under --shutdown-timeout; tests/vllm compare the simulator's),
# and its engine core dead. A dead core's answer may have no body at all.
ENGINE_STATE_WORDS = (
    "cannot schedule new futures after shutdown",
    "EngineCore encountered an issue",
    "EngineDeadError",
)


def the_requests_failure(first: tuple[int, bytes], second: tuple[int, bytes]) -> bool:
    """Whether two replicas' (status, body) 5xx answers to one request blame it."""
    if first[0] != second[0]:
        return False
    errors = [parse_error(body.decode("utf-8", "replace")) for _, body in (first, second)]
    if errors[0] is None or errors[0] != errors[1]:
        return False
    said = f"{errors[0].type} {errors[0].message}"
    return not any(words in said for words in ENGINE_STATE_WORDS)
