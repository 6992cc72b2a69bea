"""docs/troubleshooting.md explains every reason a VLLMCluster's conditions
can carry and every Event reason of the fleet's story, and names no reason the
operator no longer gives: a user reads a reason in `kubectl describe vlc` and
looks it up there."""

from __future__ import annotations

import re
from pathlib import Path

from shoal.api.status import ConditionReason, ConditionType
from shoal.controller.decide import EventReason, GateReason

DOC = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
_WORD = re.compile(r"`([A-Z][A-Za-z]+)`")


def _section(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _table_rows(heading: str) -> list[list[str]]:
    rows = [line for line in _section(heading).splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_every_reason_is_explained_and_the_conditions_table_names_no_other() -> None:
    in_table = set(_WORD.findall(_section("Conditions")))
    named = in_table | set(_WORD.findall(_section("Reasons and what to do")))
    reasons = {str(r) for r in ConditionReason}
    assert not reasons - named, f"reasons the doc does not explain: {sorted(reasons - named)}"
    unknown = in_table - reasons - {str(t) for t in ConditionType}
    assert not unknown, f"words in the Conditions table that are no reason: {sorted(unknown)}"


def test_each_condition_has_its_row() -> None:
    rows = {row[0].strip("`") for row in _table_rows("Conditions")}
    assert rows == {str(t) for t in ConditionType}


def test_the_reasons_table_names_condition_reasons_the_operator_gives() -> None:
    rows = _table_rows("Reasons and what to do")
    conditions = {str(t) for t in ConditionType}
    on_conditions = {
        row[0].strip("`")
        for row in rows
        if conditions & {where.strip() for where in row[1].split(",")}
    }
    stale = on_conditions - {str(r) for r in ConditionReason}
    assert not stale, f"reasons in the table the operator never sets: {sorted(stale)}"
    # every reason that asks something of a human has its row: Degraded's,
    # the refusals and the rollouts that stopped
    quiet = {
        ConditionReason.SERVING,
        ConditionReason.MINIMUM_REPLICAS_AVAILABLE,
        ConditionReason.VALID,
        ConditionReason.STABLE,
        ConditionReason.AS_EXPECTED,
        ConditionReason.SCALING_UP,
        ConditionReason.SCALING_DOWN,
        ConditionReason.ROLLING_OUT,
        ConditionReason.RESTARTING,
        ConditionReason.STARTING,
        # explained in the Conditions table, with nothing more to do than it says
        ConditionReason.MINIMUM_REPLICAS_UNAVAILABLE,
        ConditionReason.REPLICAS_NOT_WARM,
        ConditionReason.ROUTER_UNAVAILABLE,
        ConditionReason.NO_ROUTER,
        ConditionReason.NO_REPLICAS,
    }
    missing = {str(r) for r in ConditionReason if r not in quiet} - on_conditions
    assert not missing, f"reasons that ask for action without a row: {sorted(missing)}"


def test_every_event_reason_of_the_fleets_story_is_named() -> None:
    named = set(_WORD.findall(DOC.read_text()))
    story = {str(r) for r in EventReason}
    assert not story - named, f"Event reasons the doc does not name: {sorted(story - named)}"
    listed = set(_WORD.findall(_section("Events the operator posts on purpose")))
    unknown = listed - story - {str(r) for r in ConditionReason} - {str(r) for r in GateReason}
    assert not unknown, f"Events listed that the operator never posts: {sorted(unknown)}"
