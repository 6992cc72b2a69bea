"""`shoal plan` as a user meets its rough edges: a missing file, YAML that does
not parse and a misspelt --layout each give one line that says what to fix and
exit 2; without --layout it compares every layout of one replica within a
node that vLLM's head rules allow, exiting 0 when one fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli import main
from shoal.planner.cli import fitting_layouts
from shoal.planner.presets import PRESETS

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def test_a_missing_file_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert _error_line(capsys) == (
        f"shoal plan: cannot read {tmp_path / 'missing.yaml'}: No such file or directory"
    )


def test_malformed_yaml_is_one_line_with_the_line_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: VLLMCluster\n  spec: [\n")
    assert main(["plan", "-f", str(path)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"shoal plan: {path} is not YAML at line 2: ")


def test_a_bad_layout_says_the_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", MODEL, "--layout", "foo"])
    assert exited.value.code == 2
    assert "write parts like tp8, tp4pp2, tp4dp2 or tp8dcp2" in _error_line(capsys)


def test_without_a_layout_every_layout_within_the_node_is_compared(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--model", MODEL]) == 0
    out = capsys.readouterr().out
    for layout in ("TP1 ", "TP2 ", "TP4 ", "TP8 ", "TP4xPP2", "TP1xPP8"):
        assert layout in out, layout
    assert "TP1 refused" in out  # 70B does not fit on one GPU, and the table says so


def test_the_compared_layouts_keep_to_vllms_head_rules() -> None:
    arch = PRESETS["Llama-3.1-70B"]
    layouts = fitting_layouts(arch, gpus_per_node=8)
    assert all(arch.query_heads % layout.tensor == 0 for layout in layouts)
    assert max(layout.tensor * layout.pipeline for layout in layouts) == 8
    assert len(layouts) == len(set(layouts)) == 10
