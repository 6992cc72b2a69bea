"""`shoal operator`'s command line: what it cannot run with is refused with a
one-line error, before anything starts (a Deployment's bad args would
otherwise crash-loop on a traceback)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from shoal.cli import main


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
