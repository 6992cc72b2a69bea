"""Container logs as kubelet keeps them, for the containers the pod runner
plays, so `kubectl logs` works on kwok nodes.

`kubectl logs` goes API server -> the node's kubelet endpoint, which on a kwok
node is kwok's server. kwok (v0.8.0, `pkg/kwok/server/debugging_logs.go`)
finds the file for a container in a `Logs` object (kwok.x-k8s.io/v1alpha1)
named and namespaced like the pod, and reads it with kubelet's own reader
(`k8s.io/cri-client/pkg/logs.ReadLogs`), which skips lines not in the CRI log
format: `<RFC 3339 time> <stdout|stderr> <F|P> <text>`. So:

- each run of a container writes its own file, `<pod dir>/<container>/<N>.log`
  for its Nth restart, as kubelet lays out /var/log/pods;
- `current.log` and `previous.log` beside them are symlinks kwok's `logsFile`
  and `previousLogsFile` name (kwok resolves them per request): current is the
  running run or, once it exited, that run (as kubelet falls back to the last
  termination); previous the last run that exited and was restarted;
- the pod's `Logs` object names those two links, so it is written once per pod.

The pure parts: the line format, the file names, the `Logs` manifest. `Output`
copies a process's stdout and stderr into its file (and the runner's plain
log of the pod) as it prints.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from shoal_testbed.procs import die_with_parent_preexec

LOGS_GROUP = "kwok.x-k8s.io"
LOGS_VERSION = "v1alpha1"
LOGS_PLURAL = "logs"
# containerd splits longer lines into partial (P) records of this size.
MAX_RECORD_BYTES = 16 * 1024
CURRENT = "current.log"
PREVIOUS = "previous.log"
# How long an exited process's last output may take to be copied.
DRAIN_SECONDS = 5.0


class Stream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


def timestamp(epoch_ns: int) -> str:
    """RFC 3339 with nanoseconds in UTC, as containerd writes (Go's RFC3339Nano
    parses any number of fractional digits)."""
    seconds, nanos = divmod(epoch_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


def cri_record(stream: Stream, chunk: bytes, *, epoch_ns: int) -> bytes:
    """One CRI log record: a whole line (F, its newline kept as the record's
    end) or part of one (P: the line goes on in the next record)."""
    whole = chunk.endswith(b"\n")
    text = chunk[:-1] if whole else chunk
    tag = "F" if whole else "P"
    return f"{timestamp(epoch_ns)} {stream} {tag} ".encode() + text + b"\n"


def run_file(container_dir: Path, run: int) -> Path:
    """The log file of a container's run `run` (its restart count then)."""
    return container_dir / f"{run}.log"


def logs_manifest(
    *, pod_name: str, namespace: str, pod_uid: str, container: str, container_dir: Path
) -> dict[str, Any]:
    """The kwok `Logs` object that maps the pod's container to its files."""
    return {
        "apiVersion": f"{LOGS_GROUP}/{LOGS_VERSION}",
        "kind": "Logs",
        "metadata": {
            "name": pod_name,
            "namespace": namespace,
            # Which pod of that name it serves (a StatefulSet's pods keep names).
            "annotations": {"testbed.shoal.dev/pod-uid": pod_uid},
        },
        "spec": {
            "logs": [
                {
                    "containers": [container],
                    "logsFile": str(container_dir / CURRENT),
                    "previousLogsFile": str(container_dir / PREVIOUS),
                }
            ]
        },
    }


def point(link: Path, target: Path) -> None:
    """Make link name target, in one rename (a reader never finds it missing)."""
    swap = link.with_name(link.name + ".tmp")
    swap.unlink(missing_ok=True)
    swap.symlink_to(target.name)
    swap.replace(link)


def begin_run(container_dir: Path, run: int) -> Path:
    """The file for a new run, made current; runs before the previous one go,
    as kubelet keeps only the last terminated container's log."""
    container_dir.mkdir(parents=True, exist_ok=True)
    path = run_file(container_dir, run)
    path.touch()
    point(container_dir / CURRENT, path)
    for old in range(run - 1):
        run_file(container_dir, old).unlink(missing_ok=True)
    return path


def end_run(container_dir: Path, run: int, *, restarting: bool) -> None:
    """A run exited: when the container is restarted, it becomes `--previous`."""
    if restarting:
        point(container_dir / PREVIOUS, run_file(container_dir, run))


class Output:
    """Copies a process's stdout and stderr, record by record, into its CRI
    log file and, a line per record, into the pod's plain log."""

    def __init__(self, *, cri_path: Path, plain_path: Path) -> None:
        self._lock = threading.Lock()
        # Closed when the last stream ends.
        self._cri = open(cri_path, "ab")  # noqa: SIM115
        self._plain = open(plain_path, "ab")  # noqa: SIM115
        self._threads: list[threading.Thread] = []
        self._open_streams = 0

    def follow(self, pipes: Mapping[Stream, IO[bytes]]) -> None:
        # Every stream is counted before any copier starts: one that ends at
        # once (a process that exits) must not close the files on the others.
        with self._lock:
            self._open_streams += len(pipes)
        for stream, pipe in pipes.items():
            thread = threading.Thread(target=self._copy, args=(stream, pipe), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _copy(self, stream: Stream, pipe: IO[bytes]) -> None:
        try:
            with pipe:
                while chunk := pipe.readline(MAX_RECORD_BYTES):
                    record = cri_record(stream, chunk, epoch_ns=time.time_ns())
                    with self._lock:
                        self._cri.write(record)
                        self._cri.flush()
                        # A partial record ends its line here too, or the other
                        # stream's next line would be glued onto it.
                        self._plain.write(chunk if chunk.endswith(b"\n") else chunk + b"\n")
                        self._plain.flush()
        finally:
            with self._lock:
                self._open_streams -= 1
                if self._open_streams == 0:
                    self._cri.close()
                    self._plain.close()

    def drain(self, timeout: float = DRAIN_SECONDS) -> None:
        """Wait until an exited process's output is copied (a child it left
        behind may hold the pipes open: then stop waiting after timeout)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def start(
    argv: Sequence[str], *, env: dict[str, str], cri_path: Path, plain_path: Path
) -> tuple[subprocess.Popen[bytes], Output]:
    """Start argv in its own session (dying with the runner), its output
    copied by an Output."""
    plain_path.parent.mkdir(parents=True, exist_ok=True)
    with open(plain_path, "ab") as plain:
        plain.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent_preexec,
    )
    output = Output(cri_path=cri_path, plain_path=plain_path)
    assert process.stdout is not None and process.stderr is not None
    output.follow({Stream.STDOUT: process.stdout, Stream.STDERR: process.stderr})
    return process, output
