"""`shoal plan` as a user runs it: the issue's example, JSON output, manifests."""

from __future__ import annotations

import json
import re

import pytest

from shoal.cli import main
from tests.sample_manifests import SAMPLES

EXAMPLE = [
    "plan",
    "--model",
    "meta-llama/Llama-3.1-70B-Instruct",
    "--gpu-memory-gib",
    "79.6",
    "--gpus-per-node",
    "8",
    "--gpu-memory-utilization",
    "0.90",
    "--overhead-gib",
    "3",
    "--layout",
    "tp8",
    "--layout",
    "tp4pp2",
    "--layout",
    "tp4dp2",
]


def row(output: str, layout: str) -> list[str]:
    """The cells of a layout's row (cells are separated by two or more spaces)."""
    for line in output.splitlines():
        if line.startswith(layout + " "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row for {layout} in:\n{output}")


def test_the_issues_example_prints_the_seeds_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(EXAMPLE) == 0
    output = capsys.readouterr().out
    header = re.split(r"\s{2,}", output.splitlines()[3].strip())
    assert header[:9] == [
        "layout",
        "GPUs",
        "nodes/replica",
        "weights/GPU",
        "KV/token/GPU",
        "KV pools",
        "tokens/pool",
        "tokens total",
        "max-len reqs/pool",
    ]
    assert row(output, "TP8")[:8] == [
        "TP8", "8", "1", "16.4 GiB", "40 KiB", "1", "1,368,448", "1,368,448"
    ]  # fmt: skip
    assert row(output, "TP4xPP2")[:8] == [
        "TP4xPP2", "8", "1", "16.4 GiB", "40 KiB", "1", "1,368,448", "1,368,448"
    ]  # fmt: skip
    assert row(output, "TP4xDP2")[:8] == [
        "TP4xDP2", "8", "1", "32.9 GiB", "80 KiB", "2", "468,770", "937,540"
    ]  # fmt: skip
    assert "vLLM rounds each KV pool down to whole blocks" in output
    assert output.startswith("Llama-3.1-70B: 80 layers, 64 query heads, 8 KV heads")


def test_json_output_carries_the_same_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE, "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    by_layout = {layout["layout"]: layout for layout in document["layouts"]}
    assert by_layout["TP8"]["kvTokensPerReplica"] == 1_368_448
    assert by_layout["TP8"]["kvBytesPerTokenPerGPU"] == 40 * 1024
    assert by_layout["TP4xDP2"]["kvTokensTotal"] == 937_540
    assert by_layout["TP4xDP2"]["weightBytesPerGPU"] == 35_300_000_000
    assert "whole blocks" in document["note"]
    assert document["architecture"]["layers"] == 80


def test_a_refused_layout_says_why_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--preset", "Llama-3.1-70B", "--layout", "tp8dcp2", "--layout", "tp8"])
    output = capsys.readouterr().out
    assert code == 1
    assert row(output, "TP8xDCP2")[-1] == "no"
    assert row(output, "TP8")[-1] == "yes"
    assert "TP8xDCP2 refused: Decode context parallelism for GQA/MQA requires" in output


def test_an_unknown_model_without_numbers_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--model", "example/unknown", "--layout", "tp2"]) == 2
    assert "no architecture" in capsys.readouterr().err


def test_a_model_given_by_its_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan", "--model", "example/custom", "--layers", "32", "--query-heads", "32",
            "--kv-heads", "8", "--head-size", "128", "--parameters", "7.25e9",
            "--max-model-len", "32768", "--layout", "tp1", "--output", "json",
        ]
    )  # fmt: skip
    assert code == 0
    layout = json.loads(capsys.readouterr().out)["layouts"][0]
    assert layout["weightBytesPerGPU"] == 14_500_000_000
    assert layout["kvBytesPerTokenPerGPU"] == 131_072


def test_plan_f_plans_a_valid_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(SAMPLES / "good" / "qwen3-235b-tp8-dcp2.yaml")]) == 0
    output = capsys.readouterr().out
    assert row(output, "TP8xDCP2")[6] == "621,328"
    assert "qwen-235b is valid." in output


def test_plan_f_reports_an_invalid_manifest_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sample = SAMPLES / "bad" / "dcp-above-max.yaml"
    assert main(["plan", "-f", str(sample), "--output", "json"]) == 1
    [report] = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert report["errors"][0]["field"] == "spec.parallelism.decodeContext"
    assert report["errors"][0]["rule"] == "dcp-max"
    assert report["capacity"]["fits"] is False
