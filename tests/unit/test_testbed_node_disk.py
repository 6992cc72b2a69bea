"""The node tier's disk check (hack/shoal_testbed/nodehost.py): short of disk,
the real node's kubelet removes its images mid-tier (seen in CI at 2.7 GB free
of 252 GB) and every later pod fails to start, so the tier stops first and says
why."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from shoal_testbed import nodehost

DISK = 252 * 10**9


def on_disk(monkeypatch: pytest.MonkeyPatch, *, free: int) -> list[Path]:
    asked: list[Path] = []

    def usage(path: Path) -> SimpleNamespace:
        asked.append(path)
        return SimpleNamespace(total=DISK, used=DISK - free, free=free)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    return asked


def test_the_disk_ci_ran_short_on_is_refused_with_the_threshold_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    on_disk(monkeypatch, free=2_700_000_000)
    why = nodehost.disk_shortfall(tmp_path)
    assert why is not None
    assert why.startswith(f"2.5 GiB free on the disk of {tmp_path}")
    assert "below 2.3 GiB (1%)" in why and "~/.cache/shoal" in why


def test_room_above_the_threshold_and_headroom_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    on_disk(monkeypatch, free=DISK // 100 + nodehost.DISK_HEADROOM)
    assert nodehost.disk_shortfall(tmp_path) is None
    on_disk(monkeypatch, free=DISK // 100 + nodehost.DISK_HEADROOM - 1)
    assert nodehost.disk_shortfall(tmp_path) is not None


def test_a_testbed_not_yet_made_is_measured_where_it_will_be(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = on_disk(monkeypatch, free=DISK // 2)
    assert nodehost.disk_shortfall(tmp_path / "testbed" / "node") is None
    assert asked == [tmp_path]
