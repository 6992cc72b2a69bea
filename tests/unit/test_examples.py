"""Every example a user may apply to real GPUs passes `shoal plan -f`."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples_for_one_gpu_tp4_dp2_and_two_nodes() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"llama-8b-single-gpu", "llama-70b-tp4-dp2", "llama-405b-tp16"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_plans_and_validates(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(example)]) == 0
    assert "is valid" in capsys.readouterr().out
