"""The generated CRD: committed files up to date, a structural schema, the
subresources and columns users rely on, and defaults that match the models'."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal.api.crd import CRD_PATHS, crd, render_crd
from shoal.api.spec import VLLMClusterSpec
from shoal.cli import main
from tests.sample_manifests import good_samples, load

REPO = Path(__file__).resolve().parents[2]
SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
# Keywords a structural schema may use (apiextensions' JSONSchemaProps, minus the
# ones shoal never needs); anything else pydantic emits must have been translated.
ALLOWED = {
    "description", "type", "format", "default", "enum", "required", "properties", "items",
    "additionalProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "maxProperties", "pattern", "anyOf",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-validations",
}  # fmt: skip


@pytest.mark.parametrize("path", CRD_PATHS)
def test_committed_crd_is_what_the_models_generate(path: str) -> None:
    committed = REPO / path
    assert committed.exists(), f"{path} is missing: run `make crds`"
    assert committed.read_text() == render_crd(), f"{path} is stale: run `make crds`"


def test_shoal_crd_check_spots_a_stale_file(tmp_path: Path) -> None:
    assert main(["crd", "--root", str(tmp_path)]) == 0
    assert main(["crd", "--root", str(tmp_path), "--check"]) == 0
    (tmp_path / CRD_PATHS[1]).write_text("stale\n")
    assert main(["crd", "--root", str(tmp_path), "--check"]) == 1


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from nodes(schema[key], f"{path}[]")


def test_schema_is_structural() -> None:
    for path, node in nodes(SCHEMA):
        assert set(node) <= ALLOWED, f"{path}: {set(node) - ALLOWED}"
        if "anyOf" in node:  # only Kubernetes' int-or-string form
            assert node.get("x-kubernetes-int-or-string") is True, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node, f"{path} has no type"
        if node.get("type") == "object" and path != ".metadata":
            shapes = {"properties", "additionalProperties", "x-kubernetes-preserve-unknown-fields"}
            assert shapes & set(node), f"{path}: an object says nothing of its fields"
            assert not ("properties" in node and "additionalProperties" in node), path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), f"{path}: {key} must be boolean"


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    for section in ("spec", "status"):
        for path, node in nodes(SCHEMA["properties"][section], section):
            if not path.endswith("[]"):
                assert node.get("description"), f"{path} has no description"


def test_preserve_unknown_fields_only_on_pass_through_kubernetes_objects() -> None:
    preserved = {
        path for path, node in nodes(SCHEMA) if node.get("x-kubernetes-preserve-unknown-fields")
    }
    assert preserved == {
        ".spec.engine.env[]",
        ".spec.engine.resources.claims[]",
        ".spec.placement.tolerations[]",
        *(f".spec.{pod}.affinity.nodeAffinity" for pod in ("placement", "router.pod")),
        *(
            f".spec.{pod}.affinity.{kind}.{rule}DuringSchedulingIgnoredDuringExecution[]"
            for pod in ("placement", "router.pod")
            for kind in ("podAffinity", "podAntiAffinity")
            for rule in ("required", "preferred")
        ),
        ".spec.router.resources.claims[]",
        *(
            f".spec.{section}.pod.{field}"
            for section in ("engine", "router")
            for field in (
                "volumes[]", "volumeMounts[]", "envFrom[]", "securityContext",
                "containerSecurityContext",
            )
        ),
        ".spec.router.pod.tolerations[]",
    }  # fmt: skip


def test_lists_and_strings_walked_by_cel_are_bounded() -> None:
    spec = SCHEMA["properties"]["spec"]
    extra_args = spec["properties"]["engine"]["properties"]["extraArgs"]
    prompts = spec["properties"]["warmup"]["properties"]["prompts"]
    assert extra_args["maxItems"] and extra_args["items"]["maxLength"]
    assert prompts["maxItems"] and prompts["items"]["properties"]["text"]["maxLength"]


def test_subresources_names_and_columns() -> None:
    spec = crd()["spec"]
    names = spec["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "VLLMCluster",
        "vllmclusters",
        ["vlc"],
    )
    assert "all" not in names.get("categories", [])
    version = spec["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == [
        "Replicas",
        "Ready",
        "Warm",
        "TP",
        "PP",
        "Model",
        "Policy",
        "Status",
        "Desired",
        "Current",
        "Download",
        "Age",
    ]
    # The download's progress is long: `kubectl get -o wide` only.
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["Download"]


def test_status_has_no_defaults() -> None:
    assert not [path for path, node in nodes(SCHEMA["properties"]["status"]) if "default" in node]


def apply_schema_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """The API server's structural defaulting: fill missing properties that have a
    default, then recurse into what is there."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = yaml.safe_load(yaml.safe_dump(prop["default"]))
        for name, child in value.items():
            if name in schema["properties"]:
                apply_schema_defaults(child, schema["properties"][name])
    if isinstance(value, list) and "items" in schema:
        for item in value:
            apply_schema_defaults(item, schema["items"])
    return value


def without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        kept = {key: without_empty(child) for key, child in value.items()}
        return {key: child for key, child in kept.items() if child not in ({}, [])}
    if isinstance(value, list):
        return [without_empty(item) for item in value]
    return value


@pytest.mark.parametrize("path", good_samples(), ids=lambda p: p.stem)
def test_crd_defaults_are_the_models_defaults(path: Path) -> None:
    # What the API server stores for a sample equals what the models make of it.
    written = load(path)["spec"]
    defaulted = apply_schema_defaults(
        yaml.safe_load(yaml.safe_dump(written)), SCHEMA["properties"]["spec"]
    )
    assert defaulted == without_empty(VLLMClusterSpec.model_validate(written).to_json())
