"""Response ids that name the replica holding the response.

vLLM keeps a stored response (and the conversation `previous_response_id`
continues) in the memory of the engine that made it. The router makes the
id itself, so any router replica can tell where it lives without shared
state or a map to bound: vLLM uses a Responses request's `request_id` as the
response's id, and the router sets it to `resp_` + a tag of the replica (16
hex digits of a hash of its identity: the pod UID in Kubernetes, the URL when
static, the same in every router) + 32 random hex digits. A restarted pod is
a new identity, so the id of a response it lost names no replica any more.
"""

from __future__ import annotations

import re
import uuid

import xxhash

PREFIX = "resp_"
_TAGGED = re.compile(r"resp_([0-9a-f]{16})[0-9a-f]{32}")


def replica_tag(replica_id: str) -> str:
    return xxhash.xxh3_64_hexdigest(replica_id.encode("utf-8", "surrogatepass"))


def new_response_id(replica_id: str) -> str:
    return PREFIX + replica_tag(replica_id) + uuid.uuid4().hex


def tag_of(response_id: str) -> str | None:
    """The replica tag in an id the router made, or None for any other id."""
    match = _TAGGED.fullmatch(response_id)
    return match.group(1) if match else None
