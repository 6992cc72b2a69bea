"""Every example a user may apply to real GPUs passes `shoal plan -f`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples_for_one_gpu_tp4_dp2_and_two_nodes() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"llama-8b-single-gpu", "llama-70b-tp4-dp2", "llama-405b-tp16"} <= names
    assert "llama-405b-fp8-one-node" in names


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_plans_and_validates(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(example)]) == 0
    assert "is valid" in capsys.readouterr().out


def _spec(example: Path) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(example.read_text())["spec"]
    return spec


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_works_on_a_real_cluster_token_cache_and_requests(example: Path) -> None:
    """Gated models name the token Secret (without it the Hub answers 401),
    weights are cached, engines request CPU and memory, and gpu.memory is
    what the GPU reports (or left to GPU Feature Discovery)."""
    spec = _spec(example)
    model = spec["model"]
    if model["name"].startswith("meta-llama/"):
        assert model["source"]["hf"]["tokenSecret"]["name"] == "hf-token"
    assert model.get("cache"), "download once, not per pod"
    assert spec["engine"]["resources"]["requests"].keys() >= {"cpu", "memory"}
    assert spec.get("gpu", {}).get("memory") in (None, "79.6Gi", "81559Mi")


def test_the_405b_example_fits_one_8_gpu_node() -> None:
    spec = _spec(EXAMPLES[0].parent / "llama-405b-fp8-one-node.yaml")
    assert spec["parallelism"]["tensor"] * spec["parallelism"].get("pipeline", 1) == 8
