"""The fault matrix (issue 17): three simulated engines behind one router,
a bounded open-loop load of streamed completions, and one fault at a time
(in one engine, or in the clients), held for a few seconds, then cleared.
Each case asserts what a user of the router would notice:

- no request lost where a retry was possible: only streams cut after their
  first byte by a fault that stops an engine mid-stream (SIGKILL, SIGSTOP, a
  hang, a mid-stream stall) may fail, and only on the faulted replica; a
  request-specific 500 goes back to its client as the engine's answer;
- the faulted replica is taken out within a bound derived from the router's
  settings (faults where requests fail there), or kept in rotation with its
  breaker closed (broken metrics, misbehaving clients, a request's own 500);
- it serves again within a bound after the fault clears.

Measured numbers (lost, cut, time out, time back, share) go to a table
printed at the end of the run and written to bench-results/fault-matrix.md;
the assertions are on behaviour, with bounds from the settings
(shoal.bench.fault_plan).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.bench.fault_matrix import (
    MATRIX_ROUTER,
    CaseRun,
    Engines,
    matrix_router,
    outcomes_summary,
    run_case,
    settings_of,
)
from shoal.bench.fault_plan import SPECS, Fault, Verdict, back_bound, out_bound, table
from shoal.procs import wait_until

SETTINGS = settings_of(MATRIX_ROUTER)
# A healthy streamed request of the load takes well under this.
REQUEST_SECONDS = 1.0
RESULTS = Path("bench-results") / "fault-matrix.md"


class _Table:
    """Collects the cases' rows; prints and writes them once the run ends."""

    def __init__(self) -> None:
        self.rows: list[tuple[Verdict, float | None, float]] = []

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.rows:
            return
        order = list(Fault)
        rows = sorted(self.rows, key=lambda row: order.index(row[0].fault))
        text = table(rows)
        terminalreporter.write_sep("-", "router fault matrix")
        terminalreporter.write_line(text)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(text + "\n")


@pytest.fixture(scope="session")
def matrix_table(request: pytest.FixtureRequest) -> _Table:
    collected = _Table()
    request.config.pluginmanager.register(collected, "router-fault-matrix-table")
    return collected


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    with Engines(tmp_path_factory.mktemp("fault-matrix")) as running:
        yield running


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", list(Fault), ids=[f.value for f in Fault])
def test_a_fault_in_one_of_three_engines_loses_no_request_that_could_be_retried(
    fault: Fault, engines: Engines, matrix_table: _Table, tmp_path: Path
) -> None:
    spec = SPECS[fault]
    engines.heal()
    with matrix_router(engines, tmp_path, config=MATRIX_ROUTER, name=fault.value) as front:
        out_limit = out_bound(spec, SETTINGS)
        # Wait as long as the looser bound (a breaker that stays closed);
        # judge by the one for what happened.
        wait_back = back_bound(
            spec, SETTINGS, request_seconds=REQUEST_SECONDS, breaker_opened=False
        )
        run: CaseRun = run_case(
            fault,
            engines=engines,
            front=front,
            out_within=out_limit,
            back_within=wait_back + 1,
        )
        v = run.verdict
        back_limit = back_bound(
            spec, SETTINGS, request_seconds=REQUEST_SECONDS, breaker_opened=v.breaker_opened
        )
        matrix_table.rows.append((v, out_limit, back_limit))
        failures = outcomes_summary(run.outcomes)

        assert not v.lost, f"{len(v.lost)} of {v.requests} lost:\n{failures}"
        if not spec.cuts_streams:
            assert not v.cut
        if spec.on_every_engine:
            assert v.own_errors >= 1, "no request carried the poison: the case is void"
        if out_limit is not None:
            assert v.out_seconds is not None and v.out_seconds <= out_limit, (
                f"out after {v.out_seconds} s (bound {out_limit:.1f} s)"
            )
        elif spec.fault is not Fault.ERRORS:
            assert not v.breaker_opened, "the breaker opened on a fault that is not the replica's"
        assert v.back_seconds is not None and v.back_seconds <= back_limit, (
            f"back after {v.back_seconds} s (bound {back_limit:.1f} s)"
        )
        if fault is Fault.SLOW_CLIENTS:
            assert len(run.slow_answers) == 3
            for answer in run.slow_answers:
                # Whole, and not cut as a stall: the slow reader paused the engine.
                assert b"data: [DONE]" in answer and b'"error"' not in answer, answer[-300:]
        if fault is Fault.CLIENT_DISCONNECTS:
            assert run.clients_left >= 5, "too few clients left: the case is void"
            # The engines were told: the requests of clients who left were aborted
            # (their 400 tokens would take longer than this wait).
            wait_until(
                lambda: engines.running() == 0,
                what="the engines' requests of clients who left aborted",
                timeout=5,
                interval=0.2,
            )
