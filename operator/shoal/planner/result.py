"""The planner's output: what `shoal plan` prints and `status.capacity` embeds."""

from __future__ import annotations

from pydantic import Field

from shoal.schema.model import ApiModel


class Refusal(ApiModel):
    """A reason the layout cannot run, in vLLM's words where vLLM has them, with the fix."""

    rule: str = Field(
        description="Which rule refused the layout, e.g. dcp-divides-tp or full-length-request."
    )
    field: str | None = Field(
        default=None,
        description="The VLLMCluster field to change, when a VLLMCluster was planned.",
    )
    message: str = Field(description="What is wrong and how to fix it.")


class CapacityPlan(ApiModel):
    """Estimated memory and KV-cache capacity of one layout, before anything starts.

    Token counts are not rounded to KV blocks: vLLM rounds its pool down to
    whole blocks, so its logged "GPU KV cache size" is slightly lower."""

    layout: str = Field(description="The layout, e.g. TP8, TP4xPP2, TP4xDP2 or TP8xDCP2.")
    tensor: int = Field(description="Tensor-parallel size: GPUs each layer is split over.")
    pipeline: int = Field(description="Pipeline-parallel size: stages the layers are split into.")
    decode_context: int = Field(
        description="Decode-context-parallel size: TP ranks that split one KV head's tokens."
    )
    replicas: int = Field(description="Data-parallel replicas, each with its own KV pool.")
    gpus_per_replica: int = Field(description="GPUs of one replica (tensor x pipeline).")
    nodes_per_replica: int = Field(description="Nodes one replica spans.")
    weight_bytes_per_gpu: int = Field(
        description="Model weights held by each GPU, in bytes (parameters x bytes per "
        "parameter / (tensor x pipeline))."
    )
    kv_bytes_per_token_per_gpu: int = Field(
        description="KV cache bytes one token takes on each GPU: layers per stage x KV heads "
        "per rank (at least 1: KV heads replicate when tensor exceeds them) x head size x 2 "
        "(K and V; 1 for MLA) x bytes per element / decode context."
    )
    kv_budget_bytes_per_gpu: int = Field(
        description="Memory left for the KV cache on each GPU: memory x utilisation - "
        "weights - overhead (0 when the weights do not fit)."
    )
    kv_tokens_per_replica: int = Field(
        description="Tokens the KV pool of one replica holds (one request can use only "
        "its own replica's pool)."
    )
    kv_tokens_total: int = Field(description="Tokens held by all replicas' pools together.")
    max_model_len: int = Field(
        description="The longest request (prompt + output) planned for; 0 when unknown "
        "(neither maxModelLen nor the model's context length given)."
    )
    max_concurrency_per_replica: float = Field(
        description="Requests of maxModelLen tokens one replica holds at once, as vLLM's "
        '"Maximum concurrency" log line reports it (two decimals).'
    )
    fits: bool = Field(description="True when no rule refuses the layout.")
    refusals: list[Refusal] = Field(
        default_factory=list, description="Why the layout cannot run; empty when it fits."
    )
