"""`shoal router`'s API key file: keys one per line, and a clear error (never
a router serving without authentication) when the file is missing or empty."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shoal.router import cli


def test_keys_are_read_one_per_line_ignoring_blank_lines_and_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(b"sk-one\r\n\n  sk-two  \n")
    assert cli.read_api_keys(path) == [b"sk-one", b"sk-two"]


def test_a_missing_key_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    with pytest.raises(SystemExit, match=f"API key file {path}: No such file"):
        cli.read_api_keys(path)


def test_a_key_file_without_keys_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("\n   \n")
    with pytest.raises(SystemExit, match="no keys in it"):
        cli.read_api_keys(path)


def test_the_flag_is_parsed_as_a_path() -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["router", "--endpoints", "http://a:8000", "--api-key-file", "/etc/keys/k"]
    )
    assert args.api_key_file == Path("/etc/keys/k")
