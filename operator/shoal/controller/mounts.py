"""The volumes shoal mounts into its pods, by name and path. A user's own
(spec.engine.pod and spec.router.pod volumes and volumeMounts) must take other
names and paths: the API server refuses a pod with two volumes of one name or
two mounts at one path, so a user volume called `models` would leave every
StatefulSet unwritten (api.validation and api.cel refuse it first). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mount:
    name: str
    path: str

    def volume_mount(self, *, read_only: bool = False) -> dict[str, Any]:
        """The container's volumeMount of it."""
        found: dict[str, Any] = {"name": self.name, "mountPath": self.path}
        return {**found, "readOnly": True} if read_only else found


# Engine pods: /dev/shm for NCCL (memory-backed), the model's own PVC, the Hub's
# cache (HF_HOME), and the shared model cache's claim.
SHM = Mount("dshm", "/dev/shm")
MODEL = Mount("model", "/models")
HF_CACHE = Mount("hf-cache", "/cache/huggingface")
SHARED_CACHE = Mount("models", "/models")
ENGINE_MOUNTS = (SHM, MODEL, HF_CACHE, SHARED_CACHE)

# Router pods: its config, the clients' API keys, and the key it sends the engines.
ROUTER_CONFIG = Mount("config", "/etc/shoal/router")
API_KEYS = Mount("api-keys", "/etc/shoal/api-keys")
ENGINE_KEY = Mount("engine-key", "/etc/shoal/engine-key")
ROUTER_MOUNTS = (ROUTER_CONFIG, API_KEYS, ENGINE_KEY)
