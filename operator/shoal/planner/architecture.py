"""What the planner needs to know about a model."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

# GQA covers MHA and MQA too (KV heads = query heads, or 1). MLA (DeepSeek) caches
# one compressed latent per token and layer instead of K and V per head.
Attention = Literal["GQA", "MLA"]
WeightDtype = Literal["bfloat16", "float16", "float32", "fp8", "int8", "int4"]
KVCacheDtype = Literal["auto", "bfloat16", "float16", "float32", "fp8"]

WEIGHT_BYTES: dict[WeightDtype, Fraction] = {
    "bfloat16": Fraction(2),
    "float16": Fraction(2),
    "float32": Fraction(4),
    "fp8": Fraction(1),
    "int8": Fraction(1),
    "int4": Fraction(1, 2),
}
KV_BYTES: dict[KVCacheDtype, int] = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


@dataclass(frozen=True)
class Architecture:
    """A model's shape as vLLM's KV cache sees it.

    For MLA, `kv_heads` is 1 and `head_size` is the latent vLLM caches per token
    and layer (kv_lora_rank + qk_rope_head_dim), as vLLM's MLAAttentionSpec does.
    """

    name: str
    layers: int
    query_heads: int
    kv_heads: int
    head_size: int
    parameters: int
    dtype: WeightDtype = "bfloat16"
    kv_cache_dtype: KVCacheDtype = "auto"
    attention: Attention = "GQA"
    context_length: int | None = None

    @property
    def weight_bytes(self) -> Fraction:
        return self.parameters * WEIGHT_BYTES[self.dtype]

    @property
    def kv_element_bytes(self) -> int:
        """Bytes per cached element. vLLM's `auto` follows the model's dtype; a
        quantised checkpoint (fp8, int4 weights) still computes and caches in bf16."""
        if self.kv_cache_dtype != "auto":
            return KV_BYTES[self.kv_cache_dtype]
        return 4 if self.dtype == "float32" else 2

    @property
    def kv_tensors(self) -> int:
        """K and V per head for GQA; one latent for MLA (no factor 2 in vLLM's page size)."""
        return 1 if self.attention == "MLA" else 2
