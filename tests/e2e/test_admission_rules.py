"""Admission on the real API server, for what vLLM would read or refuse:
extraArgs that set a managed setting in any spelling vLLM 0.32 accepts, or
name the model, are refused with the field to use; the model-dependent rules
run for a model recognised by its name alone (no spec.model.architecture),
maxModelLen above its context included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.api.crd import CRD_NAME, CRD_PATHS
from shoal.api.engine_env import ManagedEnv
from shoal.api.engine_env import refusal as refusal_text
from shoal.api.validation import managed_env
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import namespace
from tests.e2e.test_crd import REPO, refusal
from tests.unit.controller_samples import ENV_SPECS, env_spec

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ns(testbed: Testbed) -> Iterator[str]:
    testbed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_PATHS[0]))
    testbed.wait_crd_established(CRD_NAME)
    with namespace(testbed, "admit") as name:
        yield name


def _manifest(**spec: Any) -> str:
    body = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, **spec}
    return json.dumps(
        {
            "apiVersion": "serving.shoal.dev/v1alpha1",
            "kind": "VLLMCluster",
            "metadata": {"name": "admit"},
            "spec": body,
        }
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--tensor_parallel_size", "2"],
        ["--tensor-parallel-size=2"],
        ["--tensor-parallel", "2"],
        ["-tp2"],
        ["--model", "other/model"],
        ["other/model"],
        ["--max_model_len=4096"],
    ],
)
def test_extra_args_vllm_reads_as_a_managed_setting_are_refused(
    testbed: Testbed, ns: str, args: list[str]
) -> None:
    error = refusal(testbed, ns, _manifest(engine={"extraArgs": args}))
    assert error is not None, f"{args} was accepted"
    assert "spec.engine.extraArgs" in error and "use spec." in error


def test_extra_args_shoal_does_not_manage_are_accepted(testbed: Testbed, ns: str) -> None:
    args = ["--enforce-eager", "--kv-cache-dtype", "fp8", "--model-impl", "vllm"]
    assert refusal(testbed, ns, _manifest(engine={"extraArgs": args})) is None
    testbed.kubectl("delete", "vllmcluster", "admit", "-n", ns)


def test_a_model_known_by_name_gets_its_heads_and_context_rules_at_admission(
    testbed: Testbed, ns: str
) -> None:
    heads = refusal(testbed, ns, _manifest(parallelism={"tensor": 3}))
    assert heads is not None and "divisible by tensor parallel size (3)" in heads
    context = refusal(testbed, ns, _manifest(engine={"maxModelLen": 200000}))
    assert context is not None
    assert "spec.engine.maxModelLen (200000) exceeds the model's context length (131072" in context
    # An architecture that says otherwise decides.
    longer = _manifest(
        model={
            "name": "meta-llama/Llama-3.1-70B-Instruct",
            "architecture": {"preset": "Llama-3.1-70B", "contextLength": 262144},
        },
        engine={"maxModelLen": 200000},
    )
    assert refusal(testbed, ns, longer) is None


def test_env_shoal_sets_is_refused_where_python_refuses_it(testbed: Testbed, ns: str) -> None:
    # The CEL rule's conditions against its Python twin's, on every spec shape that
    # makes shoal set a variable or not.
    wrong: list[str] = []
    for shape in ENV_SPECS:
        for variable in ManagedEnv:
            spec = env_spec(shape, [{"name": variable, "value": "x"}])
            manifest = _manifest(**spec.to_json()).replace('"admit"', '"admit-env"')
            error = refusal(testbed, ns, manifest)
            if variable not in managed_env(spec):
                if error is not None:
                    wrong.append(f"{shape}/{variable}: refused: {error}")
            elif error is None or "spec.engine.env: Invalid value" not in error:
                wrong.append(f"{shape}/{variable}: not refused at spec.engine.env: {error}")
            elif refusal_text(variable) not in error:
                wrong.append(f"{shape}/{variable}: refused without its fix: {error}")
    testbed.kubectl("delete", "vllmcluster", "admit-env", "-n", ns, "--ignore-not-found")
    assert wrong == []
