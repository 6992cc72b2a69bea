"""Every alert the chart ships is in README's table, which says what to do when
it fires, and has a `promtool test rules` case in which it fires (README says
each has one; `make rules` runs them)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "shoal" / "templates" / "prometheusrule.yaml"
PROMTOOL_CASES = ROOT / "tests" / "promtool" / "alerts_test.yaml"


def chart_alerts() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.MULTILINE)


def test_the_chart_ships_alerts() -> None:
    assert len(chart_alerts()) >= 10


def test_each_alert_is_in_readmes_table() -> None:
    rows = set(re.findall(r"^\| `(Shoal\w+)` \|", (ROOT / "README.md").read_text(), re.MULTILINE))
    assert set(chart_alerts()) - rows == set()
    assert rows - set(chart_alerts()) == set()


def test_each_alert_fires_in_a_promtool_case() -> None:
    cases = yaml.safe_load(PROMTOOL_CASES.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }
    assert set(chart_alerts()) - fired == set()
