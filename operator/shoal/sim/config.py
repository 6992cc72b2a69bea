"""One simulated engine's configuration: vLLM's flags over a profile's defaults."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from shoal.sim.faults import Faults
from shoal.sim.metrics import CacheConfigInfo
from shoal.sim.profiles import DEFAULT_PROFILE, PROFILES, Profile

VLLM_VERSION = "0.32.0"


class KVCacheTooSmall(ValueError):
    """vLLM's refusal to start with a KV cache that cannot hold one request of
    max_model_len tokens, in its words (v1/core/kv_cache_utils.py)."""

    def __init__(self, *, max_model_len: int, usable_tokens: int, bytes_per_token: int) -> None:
        def gib(tokens: int) -> str:
            return f"{tokens * bytes_per_token / 2**30:.2f} GiB"

        super().__init__(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({gib(max_model_len)} KV cache is needed, which is larger than the available KV "
            f"cache memory ({gib(usable_tokens)}). Based on the available memory, the "
            f"estimated maximum model length is {usable_tokens}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: str = "meta-llama/Meta-Llama-3-8B-Instruct"
    served_model_names: tuple[str, ...] = ()
    profile: Profile = PROFILES[DEFAULT_PROFILE]
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.92
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    enable_server_load_tracking: bool = False
    seed: int = 0
    api_keys: tuple[str, ...] = ()  # --api-key, else VLLM_API_KEY (sim/auth.py)
    shutdown_timeout: int = 0  # seconds (wall clock) a SIGTERM lets requests in flight run
    # Simulator-only (--sim-*).
    time_scale: float = 1.0
    startup_seconds: float = 0.0
    stop_probability: float = 0.0
    hang_after: float | None = None
    crash_after: float | None = None
    # Real vLLM's API server exits ~3.7 s after its engine core dies (fixtures README).
    crash_exit_seconds: float = 3.7
    fault_api: bool = False
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError("--sim-time-scale must be above 0")
        if self.resolved_num_gpu_blocks < 2:
            raise ValueError("the KV cache must hold at least 2 blocks")
        usable_tokens = (self.resolved_num_gpu_blocks - 1) * self.resolved_block_size
        if usable_tokens < self.resolved_max_model_len:
            raise KVCacheTooSmall(
                max_model_len=self.resolved_max_model_len,
                usable_tokens=usable_tokens,
                bytes_per_token=self.profile.kv_bytes_per_token,
            )
        self.faults.validate()

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model,)

    @property
    def resolved_max_model_len(self) -> int:
        return self.max_model_len or self.profile.max_model_len

    @property
    def resolved_max_num_seqs(self) -> int:
        return self.max_num_seqs or self.profile.max_num_seqs

    @property
    def resolved_max_num_batched_tokens(self) -> int:
        return self.max_num_batched_tokens or self.profile.max_num_batched_tokens

    @property
    def resolved_block_size(self) -> int:
        return self.block_size or self.profile.block_size

    @property
    def resolved_num_gpu_blocks(self) -> int:
        if self.num_gpu_blocks_override:
            return self.num_gpu_blocks_override
        if self.kv_cache_memory_bytes:
            per_block = self.profile.kv_bytes_per_token * self.resolved_block_size
            return self.kv_cache_memory_bytes // per_block
        return self.profile.num_gpu_blocks

    def cache_info(self) -> CacheConfigInfo:
        return CacheConfigInfo(
            block_size=self.resolved_block_size,
            num_gpu_blocks=self.resolved_num_gpu_blocks,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            user_specified_block_size=self.block_size is not None,
            max_model_len=self.resolved_max_model_len,
        )

    def system_fingerprint(self) -> str:
        """vLLM stamps a hash of its config; so do we, of ours."""
        digest = hashlib.sha256(repr(self.cache_info()).encode()).hexdigest()[:8]
        return f"vllm-{VLLM_VERSION}-{digest}"
