"""The VLLMCluster CustomResourceDefinition, generated from the pydantic models.

pydantic's JSON Schema is turned into a structural OpenAPI v3 schema: $refs
inlined, `X | None` made an optional field, titles and `additionalProperties:
false` dropped (unknown fields are refused by kubectl's strict field
validation), numeric exclusive bounds made the boolean form OpenAPI v3 uses,
and a default put on nested objects, made of their fields' defaults, so an
omitted section comes back filled in. Status carries no defaults: only shoal writes it."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from shoal.api import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from shoal.api.cel import OBJECT, RULES
from shoal.api.resource import VLLMCluster
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import VLLMClusterStatus

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"{CRD_NAME}.yaml"
# Where `shoal crd` writes the CRD, relative to the repository root.
CRD_PATHS = (f"crds/{CRD_FILE}", f"charts/shoal/crds/{CRD_FILE}")

PRINTER_COLUMNS = (
    ("Replicas", "integer", ".spec.replicas", "Data-parallel replicas wanted."),
    ("Ready", "integer", ".status.readyReplicas", "Replicas whose engines are up."),
    ("Warm", "integer", ".status.warmReplicas", "Replicas warmed and taking traffic."),
    ("TP", "integer", ".spec.parallelism.tensor", "Tensor-parallel size."),
    ("PP", "integer", ".spec.parallelism.pipeline", "Pipeline-parallel size."),
    ("Model", "string", ".spec.model.name", "The model served."),
    ("Policy", "string", ".spec.router.policy", "The router's policy."),
    (
        "Status",
        "string",
        '.status.conditions[?(@.type=="Degraded")].reason',
        "Degraded's reason: AsExpected, or what fails (EngineCrashLooping, ImagePullFailing, "
        "...); kubectl describe shows what to do.",
    ),
    (
        "Desired",
        "integer",
        ".status.autoscaling.desiredReplicas",
        "Replicas the built-in autoscaler asks for (empty when spec.autoscaling is off).",
    ),
    (
        "Current",
        "integer",
        ".status.autoscaling.currentReplicas",
        "Replicas that existed at its last decision.",
    ),
)

# Only in `kubectl get -o wide` (priority 1): long, and empty unless a download runs.
WIDE_COLUMNS = (
    (
        "Download",
        "string",
        ".status.model.download.progress",
        "The model cache's download: bytes of the total, and the time left.",
    ),
)

# Keys dropped from every node: pydantic's, or not allowed in a structural schema.
_DROPPED = {"title", "$defs"}


def openapi_schema(model: type[BaseModel], *, defaults: bool = True) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model."""
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}), defaults=defaults)


def _structural(node: dict[str, Any], defs: dict[str, Any], *, defaults: bool) -> dict[str, Any]:
    node = _resolve(node, defs)
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "additionalProperties" and isinstance(value, bool)):
            continue
        if key == "default" and (value is None or not defaults):
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            result["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            result[key] = True
        elif key == "description":
            result[key] = _prose(value)
        elif key == "const":
            result["enum"] = [value]
        elif key == "properties":
            required = set(node.get("required", ()))
            result[key] = {
                name: _property(prop, defs, required=name in required, defaults=defaults)
                for name, prop in value.items()
            }
        elif key in ("items", "additionalProperties"):
            result[key] = _structural(value, defs, defaults=defaults)
        else:
            result[key] = value
    return _ordered(result)


def _property(
    node: dict[str, Any], defs: dict[str, Any], *, required: bool, defaults: bool
) -> dict[str, Any]:
    optional = "default" in node or ("anyOf" in node and {"type": "null"} in node["anyOf"])
    schema = _structural(node, defs, defaults=defaults)
    # An object field whose model fills itself in (default_factory) defaults to its
    # fields' defaults. Not `{}`: the API server checks a default against the CEL rules
    # without defaulting inside it, and a rule would find its fields missing.
    if defaults and not required and not optional and "properties" in schema:
        schema["default"] = {
            name: prop["default"]
            for name, prop in schema["properties"].items()
            if "default" in prop
        }
    return _ordered(schema)


def _prose(text: str) -> str:
    """Docstring paragraphs as kubectl explain shows them: lines joined, paragraphs kept."""
    return "\n\n".join(" ".join(part.split()) for part in text.split("\n\n"))


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a $ref, and make `X | None` plain X; the outer node's keys (the field's
    description and default) win over the referenced model's."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        outer = {key: value for key, value in node.items() if key != "$ref"}
        return _resolve({**target, **outer}, defs)
    branches = node.get("anyOf")
    if branches and not node.get("x-kubernetes-int-or-string"):
        kept = [branch for branch in branches if branch != {"type": "null"}]
        if len(kept) == 1:
            outer = {key: value for key, value in node.items() if key != "anyOf"}
            inner = _resolve(kept[0], defs)
            return {**inner, **outer}
    return node


_KEY_ORDER = ("description", "type", "format", "default", "enum", "required", "properties")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    first = [key for key in _KEY_ORDER if key in node]
    rest = sorted(key for key in node if key not in _KEY_ORDER)
    return {key: node[key] for key in first + rest}


def _attach_rules(spec: dict[str, Any], *, root: dict[str, Any]) -> None:
    for rule in RULES:
        if rule.location == OBJECT:
            root.setdefault("x-kubernetes-validations", []).append(rule.schema())
            continue
        node = spec
        for part in filter(None, rule.location.split(".")):
            each = part.endswith("[]")
            node = node["properties"][part.removesuffix("[]")]
            if each:
                node = node["items"]
        node.setdefault("x-kubernetes-validations", []).append(rule.schema())


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict."""
    spec = openapi_schema(VLLMClusterSpec)
    status = openapi_schema(VLLMClusterStatus, defaults=False)
    schema: dict[str, Any] = {
        "description": _prose(VLLMCluster.__doc__ or ""),
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "serving.shoal.dev/v1alpha1."},
            "kind": {"type": "string", "description": "VLLMCluster."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    _attach_rules(spec, root=schema)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "shoal", "app.kubernetes.io/part-of": "shoal"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            # No categories: `kubectl get all` stays about built-in workloads.
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path, "description": text}
                        for name, kind, path, text in PRINTER_COLUMNS
                    ]
                    + [
                        {
                            "name": name,
                            "type": kind,
                            "jsonPath": path,
                            "description": text,
                            "priority": 1,
                        }
                        for name, kind, path, text in WIDE_COLUMNS
                    ]
                    + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD file's text, byte for byte what `shoal crd` writes."""
    header = (
        "# Generated by `shoal crd` (make crds) from operator/shoal/api: do not edit.\n"
        "# Helm installs CRDs from crds/ but never upgrades them; after upgrading shoal run\n"
        "#   kubectl apply --server-side -f charts/shoal/crds/\n"
    )
    body = yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=False)
    return header + body


class _Dumper(yaml.SafeDumper):
    """Writes shared sub-trees out in full: a CRD with YAML anchors is hard to read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
