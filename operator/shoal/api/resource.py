"""The whole VLLMCluster object, as a manifest or as read from the API server."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import VLLMClusterStatus
from shoal.schema.model import ApiModel


class VLLMCluster(ApiModel):
    """A data-parallel fleet of vLLM engines behind a cache-aware router, with warm-up
    gating and self-healing. `kubectl explain vllmcluster.spec` documents every field."""

    api_version: Literal["serving.shoal.dev/v1alpha1"] = Field(
        default="serving.shoal.dev/v1alpha1", description="serving.shoal.dev/v1alpha1."
    )
    kind: Literal["VLLMCluster"] = Field(default="VLLMCluster", description="VLLMCluster.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: VLLMClusterSpec = Field(description="What to run.")
    status: VLLMClusterStatus | None = Field(default=None, description="What shoal observed.")
