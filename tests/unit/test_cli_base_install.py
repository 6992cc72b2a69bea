"""`shoal` without its optional extras (the `bench` extra: rich, matplotlib):
`shoal --help` and every base command's `--help` work; the commands that need
the extra say which one, in one line, instead of a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal.cli import COMMANDS, OPTIONAL_MODULES

# Runs `shoal` as if the optional modules were not installed.
_WITHOUT_EXTRAS = (
    "import sys\n"
    f"for name in {sorted(OPTIONAL_MODULES)!r}:\n"
    "    sys.modules[name] = None\n"
    "from shoal.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
NEEDS_EXTRAS = {"demo", "bench"}


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_shoal_help_lists_every_command_without_the_extras() -> None:
    done = _shoal("--help")
    assert done.returncode == 0, done.stderr
    for name in COMMANDS:
        assert name in done.stdout


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - NEEDS_EXTRAS))
def test_each_base_command_has_its_help_without_the_extras(command: str) -> None:
    done = _shoal(command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"usage: shoal {command}" in done.stdout


@pytest.mark.parametrize("command", sorted(NEEDS_EXTRAS))
def test_a_command_that_needs_the_extras_says_so_in_one_line(command: str) -> None:
    done = _shoal(command, "--help")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "pip install 'shoal[bench]'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
