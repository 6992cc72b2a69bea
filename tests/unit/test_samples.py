"""Every sample manifest under tests/samples, checked with the models: good ones are
valid and plannable, bad ones are refused naming the field their header names."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.api.capacity import plan_spec
from shoal.api.cel import RULES
from shoal.api.resource import VLLMCluster
from shoal.api.validation import validate_cluster
from tests.sample_manifests import CAUGHT_BY, BadSample, bad_samples, good_samples, load


@pytest.mark.parametrize("path", good_samples(), ids=lambda p: p.stem)
def test_good_sample_is_valid_and_fits(path: Path) -> None:
    manifest = load(path)
    assert validate_cluster(manifest) == []
    capacity = plan_spec(VLLMCluster.model_validate(manifest).spec)
    assert capacity is not None and capacity.fits


@pytest.mark.parametrize("sample", bad_samples(), ids=lambda s: s.name)
def test_bad_sample_is_refused_naming_its_field(sample: BadSample) -> None:
    assert sample.field and sample.why, f"{sample.path} lacks its '# field:'/'# why:' header"
    assert sample.caught_by in CAUGHT_BY, f"{sample.path}: caught-by must be one of {CAUGHT_BY}"
    errors = validate_cluster(sample.manifest)
    assert sample.field in {error.field for error in errors}, [str(e) for e in errors]


def test_every_cel_rule_has_a_bad_sample_that_python_refuses_for_the_same_rule() -> None:
    # The API server's rules and shoal's Python checks must agree: each CEL rule is
    # exercised by an apiserver sample (the e2e test applies it), and Python refuses
    # that sample for the rule of the same id.
    refused_for: dict[str, list[str]] = {}
    for sample in bad_samples():
        if sample.caught_by == "apiserver":
            for error in validate_cluster(sample.manifest):
                refused_for.setdefault(error.rule, []).append(sample.name)
    missing = [rule.rule for rule in RULES if rule.rule not in refused_for]
    assert missing == []


def test_each_cel_rule_has_an_id_of_its_own() -> None:
    # One id for two rules would let one sample stand for both.
    ids = [rule.rule for rule in RULES]
    assert sorted(i for i in set(ids) if ids.count(i) > 1) == []


def test_there_are_samples_of_both_kinds() -> None:
    caught = {sample.caught_by for sample in bad_samples()}
    assert caught == set(CAUGHT_BY)
    assert len(good_samples()) >= 5
