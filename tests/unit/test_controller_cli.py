"""`shoal operator`'s command line: what it cannot run with is refused with a
one-line error, before anything starts (a Deployment's bad args would
otherwise crash-loop on a traceback)."""

from __future__ import annotations

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
