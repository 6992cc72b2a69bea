"""The forms Kubernetes requires of names, keys and labels, for the spec fields
shoal writes into them (a Secret's name, a label's value, a resource's name).

Each form is checked twice with one message: at admission (a CEL rule on the
field, so the API server names the field and the fix) and by pydantic (so
`shoal plan -f` and the operator say the same). Without them a bad value was
admitted and the API server then refused the StatefulSet it landed in,
naming the StatefulSet's field rather than the VLLMCluster's. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import MaxLen
from pydantic import AfterValidator, WithJsonSchema

# RE2 and Python read these alike; `[.]` rather than `\.`, so that they go into a
# CEL string literal unescaped.
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = f"{_LABEL}([.]{_LABEL})*"
_NAME_PART = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
SUBDOMAIN_MAX = 253


@dataclass(frozen=True)
class NameForm:
    """A form: a pattern and a bound, plus a rule beyond them written twice (`cel`,
    over `{v}`, and its twin `python`), and what the value must be."""

    must_be: str  # completes "must be ..."
    pattern: str
    max_length: int
    cel: str = ""
    python: Callable[[str], bool] | None = None

    @property
    def message(self) -> str:
        return f"must be {self.must_be}"

    def holds(self, value: str) -> bool:
        if len(value) > self.max_length or not re.fullmatch(self.pattern, value):
            return False
        return self.python is None or self.python(value)

    def _check(self, value: str) -> str:
        if not self.holds(value):
            raise ValueError(f"{value!r} {self.message}")
        return value

    def rule(self, value: str = "self") -> str:
        """The CEL expression that holds when `value` (a CEL expression) has this form."""
        # A backslash in a CEL string literal escapes: doubled, the regex gets it.
        literal = self.pattern.replace("\\", "\\\\")
        matches = f"{value}.matches('^{literal}$')"
        return f"{matches} && {self.cel.format(v=value)}" if self.cel else matches

    def schema(self) -> dict[str, Any]:
        return {
            "type": "string",
            "maxLength": self.max_length,
            "x-kubernetes-validations": [{"rule": self.rule(), "message": self.message}],
        }

    @property
    def type(self) -> Any:
        """The field type: a str with this form."""
        return Annotated[str, AfterValidator(self._check), WithJsonSchema(self.schema())]


OBJECT_NAME = NameForm(
    "a lowercase RFC 1123 subdomain, as Kubernetes object names are: lowercase letters, "
    "digits, '-' and '.', starting and ending with a letter or digit",
    _SUBDOMAIN,
    SUBDOMAIN_MAX,
)
DATA_KEY = NameForm(
    "a Secret or ConfigMap key: letters, digits, '-', '_' and '.', not '.' and not "
    "starting with '..'",
    "[.]?[-_a-zA-Z0-9][-._a-zA-Z0-9]*",
    SUBDOMAIN_MAX,
)
LABEL_VALUE = NameForm(
    "a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending "
    "with a letter or digit, or empty",
    "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
    63,
)
# The prefix's bound: the pattern bounds only the name after the '/'.
_PREFIX_CEL = f"{{v}}.indexOf('/') <= {SUBDOMAIN_MAX}"


def _prefix_bounded(value: str) -> bool:
    return value.find("/") <= SUBDOMAIN_MAX


def _extended(value: str) -> bool:
    return (
        _prefix_bounded(value)
        and "kubernetes.io/" not in value
        and not value.startswith("requests.")
    )


QUALIFIED_NAME = NameForm(
    "a label or annotation key: a name of at most 63 letters, digits, '-', '_' and '.', "
    "starting and ending with a letter or digit, optionally after a DNS subdomain prefix "
    "and '/' (example.com/rack)",
    f"({_SUBDOMAIN}/)?{_NAME_PART}",
    SUBDOMAIN_MAX + 1 + 63,
    cel=_PREFIX_CEL,
    python=_prefix_bounded,
)
EXTENDED_RESOURCE = NameForm(
    "an extended resource name, its vendor's domain then '/' (nvidia.com/gpu, amd.com/gpu); "
    "not in the kubernetes.io domain",
    f"{_SUBDOMAIN}/{_NAME_PART}",
    SUBDOMAIN_MAX + 1 + 63,
    cel=f"{_PREFIX_CEL} && !{{v}}.contains('kubernetes.io/') && !{{v}}.startsWith('requests.')",
    python=_extended,
)
# distribution/reference's grammar, as the kubelet parses an image before it
# pulls (hack/imageref is that parser; the chart's values.schema.json holds the
# same pattern): a registry host (a bracketed one is IPv6, with a ':') and port,
# a lowercase path, a tag, and a digest in an algorithm the kubelet links.
_HOST_PART = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = f"(?:{_HOST_PART}(?:[.]{_HOST_PART})*|\\[[a-fA-F0-9]*:[a-fA-F0-9:]*\\])(?::[0-9]+)?"
IMAGE_REPOSITORY = f"(?:{_REGISTRY}/)?{_PATH_PART}(?:/{_PATH_PART})*"
IMAGE_DIGEST = "(?:sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128})"
# 64 hex digits alone the kubelet takes for an image id, not a name.
IMAGE_ID = "[a-f0-9]{64}"
# Whatever the kubelet puts before a name of one part (docker.io/library/), its
# path stays within the 255 characters it takes.
IMAGE_MAX = 255 - len("docker.io/library/")


def _not_an_id(value: str) -> bool:
    return re.fullmatch(IMAGE_ID, value) is None


IMAGE = NameForm(
    "a container image the kubelet can pull: [registry[:port]/]path[:tag][@digest], "
    "the path in lowercase, a digest sha256, sha384 or sha512 in lowercase hex "
    "(vllm/vllm-openai:v0.32.0, registry.example.com:5000/vllm@sha256:<64 hex digits>)",
    f"{IMAGE_REPOSITORY}(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(@{IMAGE_DIGEST})?",
    IMAGE_MAX,
    cel="!{v}.matches('^" + IMAGE_ID.replace("{", "{{").replace("}", "}}") + "$')",
    python=_not_an_id,
)


def _no_backsteps(value: str) -> bool:
    return ".." not in value.split("/")


# A directory in a volume, or on the node: never above it (Kubernetes refuses a
# hostPath with '..', and a model path with one would leave its volume).
_NO_BACKSTEPS = "!{v}.split('/').exists(part, part == '..')"
VOLUME_PATH = NameForm(
    "a directory inside the volume, without '..'",
    ".*",
    4096,
    cel=_NO_BACKSTEPS,
    python=_no_backsteps,
)
HOST_PATH = NameForm(
    "an absolute directory on the node, other than /, without '..'",
    "/.+",
    4096,
    cel=_NO_BACKSTEPS,
    python=_no_backsteps,
)

ObjectName = OBJECT_NAME.type
DataKey = DATA_KEY.type
LabelValue = LABEL_VALUE.type
QualifiedName = QUALIFIED_NAME.type
ExtendedResource = EXTENDED_RESOURCE.type
Image = IMAGE.type
# A Hub revision names a directory of the model cache (refs/<revision>, as
# huggingface_hub lays it out), so it may not climb out of it; git refuses
# such ref names too.
REVISION = NameForm(
    "a branch, tag or commit: no spaces, not starting with '/', without '..'",
    "[^/ ][^ ]*",
    256,
    cel=_NO_BACKSTEPS,
    python=_no_backsteps,
)

VolumePath = VOLUME_PATH.type
HostPath = HOST_PATH.type
Revision = REVISION.type

# The most entries of a map of labels or annotations: CEL checks each key, and the
# API server refuses a rule whose cost it cannot bound.
MAX_ENTRIES = 256


def string_map(keys: NameForm, values: NameForm | None) -> Any:
    """A map of labels or annotations: each key of the form `keys`, each
    value of the form `values` (None: any string). The API server checks keys by a
    rule on the map (a structural schema has no propertyNames)."""
    value_type: Any = values.type if values is not None else str
    value_schema = values.schema() if values is not None else {"type": "string"}
    return Annotated[
        dict[keys.type, value_type],  # type: ignore[name-defined]  # built at run time
        MaxLen(MAX_ENTRIES),
        WithJsonSchema(
            {
                "type": "object",
                "maxProperties": MAX_ENTRIES,
                "additionalProperties": value_schema,
                "x-kubernetes-validations": [
                    {
                        "rule": f"self.all(k, {keys.rule('k')})",
                        "message": f"each key {keys.message}",
                    }
                ],
            }
        ),
    ]


Labels = string_map(QUALIFIED_NAME, LABEL_VALUE)
Annotations = string_map(QUALIFIED_NAME, None)
