"""spec.engine.env leaves alone what shoal sets from other fields: the names
`managed_env` refuses are among those the builders set for that spec (so the
rule cannot refuse what the pods do not need), and what a spec leaves to the
user is accepted."""

from __future__ import annotations

import pytest

from shoal.api.engine_env import ManagedEnv, refusal, rule_of
from shoal.api.spec import VLLMClusterSpec
from shoal.api.validation import managed_env, validate_spec
from shoal.controller.cache import build_download_job
from tests.unit.controller_samples import ENV_SPECS, REF, env_spec, fleet_of


def _set_by_shoal(spec: VLLMClusterSpec) -> set[str]:
    names: set[str] = set()
    fleet = fleet_of(spec)
    for replica in fleet.replicas:
        for statefulset in replica.manifests:
            container = statefulset["spec"]["template"]["spec"]["containers"][0]
            names |= {var["name"] for var in container["env"]}
    job = build_download_job(REF, spec, image="shoal:test")
    if job is not None:
        names |= {var["name"] for var in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    return names


@pytest.mark.parametrize("name", ENV_SPECS)
def test_the_rule_keeps_only_what_the_builders_set(name: str) -> None:
    spec = env_spec(name)
    assert spec.engine.env == []
    # The API key is refused even where no apiKeySecret sets it: a key given
    # directly would reach the engines but not the router or the operator.
    assert managed_env(spec) <= _set_by_shoal(spec) | {ManagedEnv.API_KEY}


def test_each_variable_is_kept_by_some_spec_that_sets_it() -> None:
    # Not a rule the builders never exercise.
    kept = [managed_env(env_spec(name)) & _set_by_shoal(env_spec(name)) for name in ENV_SPECS]
    assert set().union(*kept) == set(ManagedEnv)


@pytest.mark.parametrize("name", ENV_SPECS)
@pytest.mark.parametrize("variable", list(ManagedEnv))
def test_env_setting_a_managed_name_is_refused_with_its_fix(
    name: str, variable: ManagedEnv
) -> None:
    env = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": variable, "value": "x"}]
    spec = env_spec(name, env)
    errors = [(e.field, e.message, e.rule) for e in validate_spec(spec)]
    if variable in managed_env(spec):
        assert errors == [("spec.engine.env", refusal(variable), rule_of(variable))]
    else:
        assert errors == []


def test_what_a_spec_leaves_to_the_user_is_accepted() -> None:
    token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}
    assert validate_spec(env_spec("hub", [token])) == []
    assert validate_spec(env_spec("pvc", [{"name": "HF_HOME", "value": "/models/hf"}])) == []
    assert validate_spec(env_spec("node-cache", [{"name": "HF_HUB_OFFLINE", "value": "1"}])) == []


def test_every_name_is_named_once_however_often_it_is_given() -> None:
    env = [{"name": "HF_HOME", "value": "/a"}, {"name": "HF_HOME", "value": "/b"}, {"name": "X"}]
    errors = validate_spec(env_spec("node-cache", env))
    assert [e.message for e in errors] == [refusal(ManagedEnv.HF_HOME)]
    assert "spec.model.cache.node" in errors[0].message
