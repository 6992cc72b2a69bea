"""The router's configuration, `router.json`: the VLLMCluster's routing settings
(`shoal.api.router.RouterSettings`, the same model as `spec.router`, same names
and defaults) plus what the operator derives from the rest of the spec and
what belongs to one process."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from shoal.api.router import INTERNAL_PORT, RouterSettings
from shoal.api.spec import DEFAULT_MAX_NUM_SEQS


class RouterConfig(RouterSettings):
    max_num_seqs: int = Field(
        default=DEFAULT_MAX_NUM_SEQS,
        ge=1,
        description="The engines' --max-num-seqs, per replica (spec.engine.maxNumSeqs).",
    )
    api_key_file: str | None = Field(
        default=None, description="File of accepted API keys, one per line."
    )
    engine_key_file: str | None = Field(
        default=None,
        description="File whose first line is the key sent to engines (Authorization: "
        "Bearer), for engines started with --api-key; re-read when it changes.",
    )
    internal_port: int = Field(
        default=INTERNAL_PORT,
        ge=0,
        le=65535,
        description="Internal port serving the hot prefixes and the placements peers read "
        "(0: a free one).",
    )

    @classmethod
    def load(cls, path: Path | None) -> RouterConfig:
        if path is None:
            return cls()
        return cls.model_validate(json.loads(path.read_text()))

    @classmethod
    def for_cluster(cls, settings: RouterSettings, *, max_num_seqs: int) -> RouterConfig:
        """The config the operator writes for a VLLMCluster: its routing settings as
        they are, plus the engines' per-replica maxNumSeqs."""
        fields = {name: getattr(settings, name) for name in RouterSettings.model_fields}
        return cls(**fields, max_num_seqs=max_num_seqs)
