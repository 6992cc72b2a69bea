"""`shoal operator`'s command line: what it cannot run with is refused with a
one-line error, before anything starts (a Deployment's bad args would
otherwise crash-loop on a traceback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import shoal
from shoal.cli import main

OPERATOR_SOURCES = Path(shoal.__file__).resolve().parents[1]
NO_SUCH_UID = 54321  # in no /etc/passwd
# An API server nothing listens for: the operator waits for it.
REFUSING_KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # Both servers on one port: the second cannot bind.
        (["--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=8080"], "--metrics-port"),
        (["--liveness=http://127.0.0.1/healthz", "--metrics-port=80"], "--metrics-port"),
        (["--metrics-port=99999"], "--metrics-port"),
        (["--liveness=http://0.0.0.0:99999/healthz"], "--liveness"),
        (["--liveness=0.0.0.0:8080"], "--liveness"),
        (["--log-level=LOUD"], "--log-level"),
    ],
)
def test_args_it_cannot_run_with_are_refused_naming_the_flag(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["operator", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    *usage, last = err.strip().splitlines()
    assert last.startswith("shoal operator: error: ") and named in last, err
    assert usage[0].startswith("usage: shoal operator"), err


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process's socket listens on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


@pytest.mark.parametrize(
    ("flag", "args"),
    [
        ("--metrics-port", lambda port: ["--metrics-host=127.0.0.1", f"--metrics-port={port}"]),
        ("--liveness", lambda port: [f"--liveness=http://127.0.0.1:{port}/healthz"]),
    ],
)
def test_a_port_in_use_is_a_one_line_error_not_a_traceback(
    taken: int,
    flag: str,
    args: Callable[[int], list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before, the metrics server raised from its bind and kopf's liveness server
    # from among its tasks: a traceback, and a crash-looping pod that said little.
    with pytest.raises(SystemExit) as exited:
        main(["operator", *args(taken)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        f"shoal operator: error: {flag}: cannot listen on 127.0.0.1:{taken}: Address already in use"
    ), err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another UID")
def test_it_runs_as_a_uid_with_no_passwd_entry() -> None:
    # A chart value's runAsUser, or the UID OpenShift assigns: the image's
    # /etc/passwd has no entry for it, and kopf named itself from
    # getpass.getuser(), which raised KeyError: a crash-looping operator.
    with tempfile.TemporaryDirectory() as made:
        home = Path(made)
        home.chmod(0o755)  # the other UID reads its kubeconfig here
        kubeconfig = home / "kubeconfig"
        kubeconfig.write_text(REFUSING_KUBECONFIG)
        kubeconfig.chmod(0o644)
        out = _run_briefly_as_another_uid(home, kubeconfig)
    assert "KeyError" not in out, out


def _run_briefly_as_another_uid(home: Path, kubeconfig: Path) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    as_uid = ["setpriv", f"--reuid={NO_SUCH_UID}", f"--regid={NO_SUCH_UID}", "--clear-groups"]
    command = [sys.executable, "-m", "shoal.cli", "operator", "--standalone", "--metrics-port=0"]
    operator = subprocess.Popen(
        [*as_uid, *command],
        env={**env, "PYTHONPATH": str(OPERATOR_SOURCES)},
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Up, it retries the API server it cannot reach; down, it exited.
        with pytest.raises(subprocess.TimeoutExpired):
            operator.wait(timeout=5)
    finally:
        operator.terminate()
        out, _ = operator.communicate(timeout=30)
    return out
