"""`pip install .` as a user runs it, in a fresh venv with no extras: the
`shoal` command it installs answers `shoal --help` and `shoal plan --help`,
and the extras' modules (rich, matplotlib, OpenTelemetry) are not there, so
nothing the base commands do leans on them. (tests/unit/test_cli_base_install.py
hides the extras inside the dev venv; this is the real install. The venv is
made without pip and this interpreter's pip installs into it (`pip --python`):
the same install, without ensurepip's minute.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What `pip install .` reads from a checkout (pyproject.toml names them).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "operator")
EXTRAS_MODULES = ("rich", "matplotlib", "opentelemetry")


def _run(*argv: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )


# Above the tier's 120 s: pip fetches and installs the base dependencies from
# the package index (network and disk bound, none of it shoal's code).
@pytest.mark.timeout(300)
def test_pip_install_dot_without_extras_gives_a_shoal_whose_help_works(tmp_path: Path) -> None:
    checkout = tmp_path / "shoal"
    checkout.mkdir()
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
            shutil.copytree(source, checkout / name, ignore=ignore)
        else:
            shutil.copy2(source, checkout / name)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, clear=True)
    bin_dir = env_dir / "bin"
    installed = _run(
        *(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install"),
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",  # bytecode is compiled on first import anyway
        checkout,
        timeout=280,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    helped = _run(bin_dir / "shoal", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: shoal" in helped.stdout and "plan" in helped.stdout
    planned = _run(bin_dir / "shoal", "plan", "--help")
    assert planned.returncode == 0, planned.stderr
    assert "usage: shoal plan" in planned.stdout
    for module in EXTRAS_MODULES:
        probe = _run(bin_dir / "python", "-c", f"import {module}")
        assert probe.returncode != 0, f"{module} is installed without its extra"
