"""The base of every API model: camelCase JSON names over snake_case Python.

Kubernetes spells acronyms in one case inside a camelCase name (`podIP`,
`hostIPC`), so `weight_bytes_per_gpu` becomes `weightBytesPerGPU`, not
`weightBytesPerGpu`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

# Acronyms written in capitals when they are not the first word of a name.
ACRONYMS = frozenset({"api", "dcp", "gpu", "gpus", "hf", "id", "ip", "kv", "pvc", "ttft", "url"})


def camel(name: str) -> str:
    """snake_case -> the JSON name of a field (`kv_cache_dtype` -> `kvCacheDtype`)."""
    first, *rest = name.split("_")
    return first + "".join(_word(part) for part in rest)


def _word(part: str) -> str:
    if part == "gpus":
        return "GPUs"
    return part.upper() if part in ACRONYMS else part.capitalize()


class ApiModel(BaseModel):
    """A part of the VLLMCluster resource, or of a capacity plan.

    Unknown fields are errors, as under `kubectl apply`'s strict field
    validation, so a misspelt field is reported rather than silently ignored."""

    model_config = ConfigDict(
        alias_generator=camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=False,
        use_attribute_docstrings=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _nulls_as_absent(cls, data: Any) -> Any:
        # The API server prunes a null in a field its schema types, as if it had not
        # been given (`limits:` left empty in YAML); so does shoal, so `shoal plan -f`
        # judges a manifest as admission does.
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    def to_json(self) -> dict[str, object]:
        """The resource's JSON form: camelCase names, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
