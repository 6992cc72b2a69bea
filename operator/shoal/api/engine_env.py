"""The engine environment variables shoal sets that spec.engine.env must leave
alone (`validation.managed_env` says when): the user's entries come after
shoal's, and Kubernetes lets the later of two entries with one name win, so
one there would quietly undo what another field asked for (a key the router
does not know, a token from another Secret, a cache off the node, every worker
of a group with one rank). Names shoal sets where a user's value harms
nothing (HF_HOME without a node cache, HF_HUB_OFFLINE) are left to the user."""

from __future__ import annotations

from enum import StrEnum


class ManagedEnv(StrEnum):
    """Variables shoal sets in the engine containers that spec.engine.env may not."""

    API_KEY = "VLLM_API_KEY"  # vLLM reads it when no --api-key is given
    NODE_RANK = "NODE_RANK"  # a multi-node worker's rank, read back by its args
    HF_HOME = "HF_HOME"
    HF_TOKEN = "HF_TOKEN"


# What each is for and where to say it instead: the Python rule's messages and the
# CEL rule's, word for word.
REASONS: dict[ManagedEnv, str] = {
    ManagedEnv.API_KEY: "put the key in a Secret and name it in spec.engine.apiKeySecret, "
    "so that the router and the operator send it too",
    ManagedEnv.NODE_RANK: "shoal gives each worker of a replica that spans nodes its own rank "
    "in it",
    ManagedEnv.HF_HOME: "with spec.model.cache.node shoal points it at the node's directory, "
    "and another would download again on every restart: set spec.model.cache.node.path "
    "instead",
    ManagedEnv.HF_TOKEN: "shoal sets it from spec.model.source.hf.tokenSecret: name the token "
    "there only",
}


def rule_of(name: ManagedEnv) -> str:
    """The id of the rule keeping spec.engine.env off it (one CEL rule each)."""
    return "managed-env-" + name.lower().replace("_", "-")


def refusal(name: ManagedEnv) -> str:
    return f"spec.engine.env must not set {name}: {REASONS[name]}"
