"""`python -m shoal_testbed.alerts` (`make rules`): the chart's alerts checked
by promtool.

Renders the chart as README's install does, with the PrometheusRule and the
monitors on (release `shoal` in `shoal-system`, so jobs are `shoal-metrics`
and `shoal-system/shoal-fleets`), writes the rule's groups as a rules file,
and runs `promtool check rules` on it and `promtool test rules` on every
tests/promtool/*.yaml (whose `rule_files` name `shoal-rules.yaml`). Exit
status: promtool's, or 1 when no PrometheusRule renders."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from shoal_testbed import prometheus
from shoal_testbed.cluster import REPO, bin_dir

CHART = REPO / "charts" / "shoal"
TESTS = REPO / "tests" / "promtool"
RULES_FILE = "shoal-rules.yaml"
RELEASE, NAMESPACE = "shoal", "shoal-system"
MONITORING_ON = (
    "monitoring.prometheusRule.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.podMonitor.enabled=true",
)


def render(*, values: Sequence[str] = MONITORING_ON) -> list[dict[str, Any]]:
    """`helm template` of the chart, as manifests."""
    sets = [arg for value in values for arg in ("--set", value)]
    rendered = subprocess.run(
        [str(bin_dir() / "helm"), "template", RELEASE, str(CHART), "-n", NAMESPACE, *sets],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [m for m in yaml.safe_load_all(rendered) if m]


def rules_text(manifests: Sequence[dict[str, Any]]) -> str:
    found = [m for m in manifests if m["kind"] == prometheus.PROMETHEUS_RULE]
    if len(found) != 1:
        raise ValueError(f"expected one PrometheusRule, rendered {len(found)}")
    return yaml.safe_dump(prometheus.rules_file(found[0]), sort_keys=False)


def main() -> int:
    promtool = str(prometheus.binary("promtool"))
    try:
        text = rules_text(render())
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="shoal-rules-") as work:
        rules = Path(work) / RULES_FILE
        rules.write_text(text)
        tests = sorted(TESTS.glob("*.yaml"))
        for test in tests:
            shutil.copy(test, Path(work) / test.name)
        checked = subprocess.run([promtool, "check", "rules", str(rules)], check=False)
        if checked.returncode != 0:
            return checked.returncode
        tested = subprocess.run(
            [promtool, "test", "rules", *(t.name for t in tests)], cwd=work, check=False
        )
        return tested.returncode


if __name__ == "__main__":
    sys.exit(main())
