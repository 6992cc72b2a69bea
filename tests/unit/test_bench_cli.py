"""`shoal bench compare --router-config`: inline JSON, as docs/benchmarks.md
writes it, or a file of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.bench.cli import _router_config


def test_router_config_is_inline_json_or_a_file(tmp_path: Path) -> None:
    inline = '{"thresholds": {"hitWeight": 1.0}}'
    assert _router_config(inline) == {"thresholds": {"hitWeight": 1.0}}
    path = tmp_path / "router.json"
    path.write_text(inline)
    assert _router_config(str(path)) == {"thresholds": {"hitWeight": 1.0}}


@pytest.mark.parametrize("value", ["{not json", "[1, 2]", "/no/such/router.json"])
def test_a_bad_router_config_is_a_clear_error(value: str) -> None:
    with pytest.raises(SystemExit, match="--router-config"):
        _router_config(value)
