"""Shared test helpers.

Under CI=true a tier whose prerequisites are missing fails instead of
skipping, so a broken set-up can never pass as a green run."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(ok: bool, why: str) -> None:
    """Skip locally, fail in CI, when a prerequisite is missing."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing under CI=true: {why}", pytrace=False)
    pytest.skip(why)
