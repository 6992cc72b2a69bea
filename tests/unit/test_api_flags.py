"""spec.engine.extraArgs read as vLLM 0.32's parser reads them: a managed
setting is refused in every spelling vLLM accepts (underscores, `=`, dotted
keys, unique prefixes, short flags with the value attached), as is a
positional argument (vLLM's model), with the field to use instead; the CEL
rule's pattern agrees on each."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.api.flags import MANAGED_SETTINGS, exempt_pattern, managed_pattern, refused_args
from shoal.api.validation import validate_cluster
from shoal.api.vllm_options import OPTIONS, VLLM_VERSION


def test_the_options_are_vllm_0_32s() -> None:
    assert VLLM_VERSION.startswith("0.32")
    assert OPTIONS["--tensor-parallel-size"] == ("tensor_parallel_size", True)
    assert OPTIONS["--enforce-eager"][1] is False


def test_every_managed_setting_is_one_vllm_has() -> None:
    dests = {dest for dest, _ in OPTIONS.values()} | {"model_tag"}
    assert set(MANAGED_SETTINGS) <= dests


def test_no_unmanaged_long_option_is_a_prefix_of_a_managed_one() -> None:
    # The CEL pattern refuses every prefix of a managed option; an unmanaged
    # option spelt as such a prefix would be refused with it.
    managed = [o for o, (d, _) in OPTIONS.items() if d in MANAGED_SETTINGS and o[:2] == "--"]
    clashes = [
        (option, m)
        for option, (dest, _) in OPTIONS.items()
        if dest not in MANAGED_SETTINGS and option[:2] == "--"
        for m in managed
        if m != option and m.startswith(option)
    ]
    assert clashes == []


@pytest.mark.parametrize(
    ("args", "setting", "use"),
    [
        (["--tensor_parallel_size", "2"], "tensor_parallel_size", "spec.parallelism.tensor"),
        (["--tensor-parallel-size=2"], "tensor_parallel_size", "spec.parallelism.tensor"),
        (["--tensor-parallel", "2"], "tensor_parallel_size", "spec.parallelism.tensor"),
        (["-tp2"], "tensor_parallel_size", "spec.parallelism.tensor"),
        (["--max_model_len=4096"], "max_model_len", "spec.engine.maxModelLen"),
        (["--device-memory-utilization", "0.5"], "gpu_memory_utilization", "spec.engine"),
        (["--model", "other/model"], "model", "spec.model.name"),
        (["--enforce-eager", "other/model"], "model_tag", "spec.model.name"),
        (["--config", "serve.yaml"], "config", "extraArgs entry"),
        (["--prefix_caching_hash_algo", "builtin"], "prefix_caching_hash_algo", "sha256_cbor"),
    ],
)
def test_a_managed_setting_is_refused_in_any_spelling_with_the_field_to_use(
    args: list[str], setting: str, use: str
) -> None:
    [refused] = refused_args(args)
    assert refused.setting == setting
    assert use in str(refused)
    if setting != "model_tag":
        assert re.match(managed_pattern(), refused.arg.replace("_", "-"))


@pytest.mark.parametrize(
    "args",
    [
        ["--enforce-eager"],
        ["--kv-cache-dtype", "fp8"],
        ["--seed", "-1"],
        ["--compilation-config.mode", "3"],
        ["--compilation-config", '{"mode": 3}'],
        ["--model-impl", "vllm"],
        ["--max-num-partial-prefills=2"],
        ["-q", "fp8"],
        ["-O3"],
    ],
)
def test_settings_shoal_does_not_manage_pass(args: list[str]) -> None:
    assert refused_args(args) == []
    flags = [a for a in args if a.startswith("-") and not re.match(r"^-\d", a)]
    assert not any(re.match(managed_pattern(), a.replace("_", "-")) for a in flags)


def test_what_follows_an_option_vllm_does_not_know_is_its_value_not_the_model() -> None:
    assert refused_args(["--sim-time-scale", "50", "--enforce-eager"]) == []


def test_a_size_in_bytes_units_says_which_quantity_to_write() -> None:
    from tests.unit.test_api_models import manifest

    [error] = validate_cluster(manifest(gpu={"memory": "80GB"}))
    assert error.field == "spec.gpu.memory"
    assert "for 80GB write 80Gi" in error.message


def test_a_misspelt_field_gets_the_nearest_field_as_a_suggestion() -> None:
    from tests.unit.test_api_models import manifest

    [error] = validate_cluster(manifest(engine={"maxModelLength": 8192}))
    assert error.field == "spec.engine.maxModelLength"
    assert "did you mean maxModelLen?" in error.message


def _admission_refuses(arg: str) -> bool:
    """The CEL rule's reading of one entry (api.cel's managed-flags)."""
    spelt = arg.replace("_", "-")
    return bool(re.match(managed_pattern(), spelt)) and not re.match(exempt_pattern(), spelt)


@st.composite
def _spellings(draw: st.DrawFn) -> str:
    """An option of vLLM's, cut to a prefix or not, '-' as '_' or not, with a value
    attached, a key or an '=' after it, or nothing."""
    option = draw(st.sampled_from(sorted(OPTIONS)))
    option = option[: len(option) - draw(st.integers(0, max(0, len(option) - 2)))]
    if draw(st.booleans()):
        option = option[:2] + option[2:].replace("-", "_")
    return option + draw(st.sampled_from(["", "=1", ".x", ".x=1", "2", "=", "_x", "-x"]))


@settings(max_examples=3000, deadline=None)
@given(arg=_spellings())
def test_admission_and_shoal_plan_refuse_the_same_option_spellings(arg: str) -> None:
    # The API server's RE2 rule and shoal's argparse model, on one entry each.
    python = [refused for refused in refused_args([arg]) if refused.setting != "model_tag"]
    assert _admission_refuses(arg) == bool(python), (arg, python)
