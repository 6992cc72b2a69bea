"""The router's API key file: keys one per line, a clear error (never a router
serving without authentication) when the file is missing or empty at start,
and rotation in place, as kubelet updates a mounted Secret."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shoal.router.keys import KeyFile, KeyFileError, Keys, read_keys


def test_keys_are_read_one_per_line_ignoring_blank_lines_and_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(b"sk-one\r\n\n  sk-two  \n")
    assert read_keys(path) == [b"sk-one", b"sk-two"]


def test_a_missing_key_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    with pytest.raises(KeyFileError, match=f"API key file {path}: No such file"):
        KeyFile(path)


def test_a_key_file_without_keys_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("\n   \n")
    with pytest.raises(KeyFileError, match="no keys in it"):
        KeyFile(path)


def _secret_volume(root: Path, version: int, keys: str) -> Path:
    """kubelet's layout: keys -> ..data/keys, ..data -> a versioned directory,
    swapped atomically on update."""
    version_dir = root / f"..v{version}"
    version_dir.mkdir()
    (version_dir / "keys").write_text(keys)
    link = root / "..data"
    staged = root / "..data_tmp"
    staged.symlink_to(version_dir.name)
    staged.replace(link)
    if not (root / "keys").is_symlink():
        (root / "keys").symlink_to("..data/keys")
    return root / "keys"


def test_a_rotated_secret_replaces_the_keys(tmp_path: Path) -> None:
    path = _secret_volume(tmp_path, 1, "sk-old\n")
    keys = KeyFile(path)
    assert keys.refresh() is False  # unchanged: nothing re-read
    _secret_volume(tmp_path, 2, "sk-old\nsk-new\n")
    assert keys.refresh() is True
    assert keys.keys == [b"sk-old", b"sk-new"]
    _secret_volume(tmp_path, 3, "sk-new\n")
    assert keys.refresh() is True
    assert keys.keys == [b"sk-new"]


def test_a_file_that_turns_empty_or_vanishes_keeps_the_previous_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-one\n")
    keys = KeyFile(path)
    caplog.set_level(logging.WARNING)
    path.write_text("")
    assert keys.refresh() is False
    assert keys.keys == [b"sk-one"]
    assert "no keys in it (one key per line); keeping the previous 1 key(s)" in caplog.text
    caplog.clear()
    assert keys.refresh() is False  # the same bad file: not logged again
    assert caplog.text == ""
    caplog.clear()
    path.unlink()
    assert keys.refresh() is False
    assert keys.keys == [b"sk-one"]
    assert "No such file" in caplog.text
    path.write_text("sk-two\n")  # fixed: taken up
    assert keys.refresh() is True
    assert keys.keys == [b"sk-two"]


def test_a_token_is_accepted_exactly_when_it_is_one_of_the_keys() -> None:
    many = [b"sk-%05d" % i for i in range(10_000)]
    keys = Keys(many)
    assert keys and keys.keys[0] == b"sk-00000"  # the peers' key stays first
    assert keys.accepts(b"sk-09999") and keys.accepts(b"sk-00000")
    for wrong in (b"sk-10000", b"sk-0999", b"sk-099999", b"", b"SK-00001", b"\xff\xfe"):
        assert not keys.accepts(wrong), wrong
    assert not Keys([]) and not Keys([]).accepts(b"")
