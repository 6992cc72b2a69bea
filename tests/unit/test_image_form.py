"""spec.image in the form the kubelet parses before it pulls: refused at
admission (CEL) and by `shoal plan -f` with the field and the form, rather
than admitted and found only when a replica's pod reports InvalidImageName
(its rollout taken back). The e2e test_image_refs holds the form against the
real API server and the kubelet's own parser."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.api.spec import DEFAULT_IMAGE
from shoal.api.validation import validate_cluster
from shoal.schema.names import IMAGE

DIGEST = "sha256:" + "0" * 64
ADMITTED = (
    DEFAULT_IMAGE,
    "vllm/vllm-openai",
    "registry.example.com:5000/team/vllm:v0.32.0-cu128",
    f"registry.example.com/vllm@{DIGEST}",
    f"vllm/vllm-openai:v0.32.0@{DIGEST}",
    "[fd00::1]:5000/vllm:v1",
    "localhost:5000",  # the image localhost, tag 5000
    "Registry.Example.com/vllm",  # a registry's host may have capitals
    "a" * 63,  # not 64 hex digits: a name
)
REFUSED = (
    "",
    " vllm/vllm-openai",
    "vllm/vllm-openai:v0.32.0 ",
    "vllm/VLLM-openai",  # the path is lowercase
    "vllm/vllm-openai:",
    "vllm/vllm-openai:-v1",  # a tag starts with a letter, digit or _
    "vllm/vllm-openai@sha256:abc",  # a digest is whole
    "vllm/vllm-openai@md5:" + "0" * 32,  # the kubelet links sha256, sha384, sha512
    "vllm/vllm-openai@sha256:" + "A" * 64,  # lowercase hex
    "https://registry.example.com/vllm",
    "registry.example.com//vllm",
    "[088]/vllm",  # a bracketed host is IPv6, with a ':'
    "0" * 64,  # an image id, not a name
    # Past the chart's bound too (which the kubelet would still take here).
    "registry.example.com/" + "v" * (IMAGE.max_length - len("registry.example.com/") + 1),
)


def _manifest(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": "fleet"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "image": image},
    }


@pytest.mark.parametrize("image", ADMITTED)
def test_an_image_the_kubelet_can_pull_is_admitted(image: str) -> None:
    assert IMAGE.holds(image)
    assert validate_cluster(_manifest(image)) == []


@pytest.mark.parametrize("image", REFUSED)
def test_an_image_the_kubelet_cannot_parse_is_refused_naming_the_field_and_the_form(
    image: str,
) -> None:
    assert not IMAGE.holds(image)
    [error] = validate_cluster(_manifest(image))
    assert error.field == "spec.image"
    assert "[registry[:port]/]path[:tag][@digest]" in error.message


def test_the_cel_rule_carries_the_patterns_backslashes_into_the_regex() -> None:
    # CEL reads '\\[' in a string literal as the regex \[: a bracket, not a class.
    assert "|\\\\[[a-fA-F0-9]*:" in IMAGE.rule()
    assert "|\\[[a-fA-F0-9]*:" in IMAGE.pattern
