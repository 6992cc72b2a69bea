"""The pod runner's container logs in kubelet's CRI format, laid out so kwok's
`Logs` object serves `kubectl logs` and `kubectl logs --previous`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from shoal_testbed import podlogs
from shoal_testbed.podlogs import Stream

# 2026-12-01T16:00:00Z plus 5 ns.
EPOCH_NS = 1_796_140_800_000_000_005


def test_a_line_is_one_whole_record_with_a_nanosecond_utc_time() -> None:
    record = podlogs.cri_record(Stream.STDERR, b"error: bad flag\n", epoch_ns=EPOCH_NS)
    assert record == b"2026-12-01T16:00:00.000000005Z stderr F error: bad flag\n"


def test_a_line_cut_short_is_a_partial_record_that_still_ends_the_line_in_the_file() -> None:
    record = podlogs.cri_record(Stream.STDOUT, b"x" * 10, epoch_ns=EPOCH_NS)
    assert record == b"2026-12-01T16:00:00.000000005Z stdout P " + b"x" * 10 + b"\n"


def test_an_empty_line_is_an_empty_whole_record() -> None:
    record = podlogs.cri_record(Stream.STDOUT, b"\n", epoch_ns=EPOCH_NS)
    assert record == b"2026-12-01T16:00:00.000000005Z stdout F \n"


def test_the_logs_object_is_named_like_the_pod_and_names_the_current_and_previous_links(
    tmp_path: Path,
) -> None:
    manifest = podlogs.logs_manifest(
        pod_name="crash-r0-0",
        namespace="ns",
        pod_uid="u-1",
        container="engine",
        container_dir=tmp_path / "engine",
    )
    assert manifest["kind"] == "Logs" and manifest["apiVersion"] == "kwok.x-k8s.io/v1alpha1"
    assert (manifest["metadata"]["name"], manifest["metadata"]["namespace"]) == (
        "crash-r0-0",
        "ns",
    )
    assert manifest["spec"]["logs"] == [
        {
            "containers": ["engine"],
            "logsFile": str(tmp_path / "engine" / "current.log"),
            "previousLogsFile": str(tmp_path / "engine" / "previous.log"),
        }
    ]


def test_current_follows_the_running_run_and_previous_the_last_one_restarted(
    tmp_path: Path,
) -> None:
    container = tmp_path / "engine"
    current, previous = container / "current.log", container / "previous.log"
    podlogs.begin_run(container, 0).write_text("run 0\n")
    assert current.read_text() == "run 0\n" and not previous.exists()
    podlogs.end_run(container, 0, restarting=True)
    # While it waits to restart, both show the run that exited (as kubelet).
    assert current.read_text() == previous.read_text() == "run 0\n"
    podlogs.begin_run(container, 1).write_text("run 1\n")
    assert (current.read_text(), previous.read_text()) == ("run 1\n", "run 0\n")
    podlogs.end_run(container, 1, restarting=True)
    podlogs.begin_run(container, 2)
    assert previous.read_text() == "run 1\n"
    # Only the last terminated run's file is kept.
    assert sorted(p.name for p in container.glob("[0-9]*.log")) == ["1.log", "2.log"]


def test_a_run_that_ends_the_pod_stays_current_and_is_not_previous(tmp_path: Path) -> None:
    container = tmp_path / "job"
    podlogs.begin_run(container, 0).write_text("done\n")
    podlogs.end_run(container, 0, restarting=False)
    assert (container / "current.log").read_text() == "done\n"
    assert not (container / "previous.log").exists()


def test_a_process_output_is_copied_to_its_cri_file_and_the_plain_log(tmp_path: Path) -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.stdout.write('tail')"
    cri, plain = tmp_path / "0.log", tmp_path / "pod.log"
    process, output = podlogs.start(
        [sys.executable, "-c", script], env={}, cri_path=cri, plain_path=plain
    )
    assert process.wait(timeout=20) == 0
    output.drain()
    records = sorted(line.split(" ", 1)[1] for line in cri.read_text().splitlines())
    assert records == ["stderr F err", "stdout F out", "stdout P tail"]
    lines = plain.read_text().splitlines()
    assert lines[0].startswith("--- ") and sorted(lines[1:]) == ["err", "out", "tail"]


def test_a_stream_that_ends_at_once_leaves_the_other_streams_copied(tmp_path: Path) -> None:
    # A process that closes stdout at once (or exits while the runner is
    # still attaching stderr) must not close the log files on stderr.
    cri, plain = tmp_path / "0.log", tmp_path / "pod.log"
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    os.close(stdout_w)
    output = podlogs.Output(cri_path=cri, plain_path=plain)
    with open(stdout_r, "rb") as stdout, open(stderr_r, "rb") as stderr:
        output.follow({Stream.STDOUT: stdout, Stream.STDERR: stderr})
        time.sleep(0.2)  # the stdout copier has seen its end by now
        os.write(stderr_w, b"late\n")
        os.close(stderr_w)
        output.drain()
    assert [line.split(" ", 1)[1] for line in cri.read_text().splitlines()] == ["stderr F late"]
    assert plain.read_text() == "late\n"
