"""A cluster's name, checked at admission (CEL) and by `shoal plan -f` (Python)
for the same reasons: it must be a DNS-1035 label, since Services are named
after it, and short enough that every name shoal derives from it fits, the
longest being a worker StatefulSet's controller-revision-hash label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal.api.cel import OBJECT, RULES
from shoal.api.crd import crd
from shoal.api.resource import VLLMCluster
from shoal.api.spec import MAX_REPLICAS
from shoal.api.validation import MAX_NAME_LENGTH, validate_cluster, validate_name
from shoal.cli import main
from shoal.controller.desired import build_replica, desired_fleet
from shoal.controller.identity import ClusterRef
from shoal.controller.names import DNS_LABEL_MAX, REVISION_HASH_SUFFIX

LONGEST = "l" + "x" * (MAX_NAME_LENGTH - 1)


def manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": name},
        # Two nodes per replica, so replicas have worker StatefulSets too.
        "spec": {"model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
                 "parallelism": {"tensor": 16}},
    }  # fmt: skip


def rules_of(errors: list[Any]) -> list[str]:
    return [error.rule for error in errors]


@pytest.mark.parametrize("name", ["70b", "-fleet", "fleet-", "Fleet", "fleet.a", "a_b"])
def test_a_name_that_is_not_a_dns_label_starting_with_a_letter_is_refused(name: str) -> None:
    [error] = validate_name(name)
    assert (error.field, error.rule) == ("metadata.name", "name-dns-label")
    assert "starting with a letter" in error.message


def test_the_limit_is_what_the_longest_derived_name_leaves_of_63_characters() -> None:
    # <name>-r9999-w-<10-character hash>: 8 + 11 characters after the name.
    assert MAX_NAME_LENGTH == 63 - len(f"-r{MAX_REPLICAS - 1}-w") - len(REVISION_HASH_SUFFIX) == 44


def test_one_character_past_the_limit_is_refused_saying_which_names_would_not_fit() -> None:
    assert validate_name(LONGEST) == []
    [error] = validate_name(LONGEST + "x")
    assert error.rule == "name-length"
    assert f"at most {MAX_NAME_LENGTH}" in error.message
    assert "controller-revision-hash" in error.message


def test_a_60_character_name_is_refused_by_the_manifest_check_too() -> None:
    name = "llama-70b-" + "x" * 50
    assert "name-length" in rules_of(validate_cluster(manifest(name)))
    assert validate_cluster(manifest(LONGEST)) == []


def test_every_name_and_label_shoal_derives_from_the_longest_name_fits() -> None:
    spec = VLLMCluster.model_validate(manifest(LONGEST)).spec
    ref = ClusterRef(name=LONGEST, namespace="default", uid="0")
    fleet = desired_fleet(ref, spec, router_image="shoal:test")
    last = build_replica(ref, spec, index=MAX_REPLICAS - 1)
    too_long = []
    for object_ in fleet.all() + last.manifests:
        meta = object_["metadata"]
        values = [meta["name"], *meta.get("labels", {}).values()]
        if object_["kind"] == "StatefulSet":
            pods = object_["spec"]["replicas"] + object_["spec"].get("ordinals", {}).get("start", 0)
            values += [meta["name"] + REVISION_HASH_SUFFIX, f"{meta['name']}-{pods - 1}"]
            values += object_["spec"]["template"]["metadata"]["labels"].values()
        if object_["kind"] == "Service":
            assert len(meta["name"]) <= DNS_LABEL_MAX
        too_long += [value for value in values if len(value) > DNS_LABEL_MAX]
    assert too_long == []
    assert last.worker is not None and len(last.worker["metadata"]["name"]) == 52


def test_the_name_rules_sit_on_the_whole_object_where_cel_sees_metadata_name() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    on_object = [rule for rule in RULES if rule.location == OBJECT]
    assert {rule.rule for rule in on_object} == {"name-dns-label", "name-length"}
    assert schema["x-kubernetes-validations"] == [rule.schema() for rule in on_object]
    assert f"<= {MAX_NAME_LENGTH}" in on_object[1].expression


def test_shoal_plan_refuses_the_name_as_admission_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "70b.yaml"
    path.write_text(yaml.safe_dump(manifest("70b")))
    assert main(["plan", "-f", str(path)]) == 1
    assert "  metadata.name: '70b' is not a DNS-1035 label" in capsys.readouterr().out
