"""Start, watch and stop the testbed's processes.

Every process gets its own session (process group), so stopping it also stops
whatever it forked. A testbed owned by a pytest run asks the kernel to signal
its processes when that run dies (PR_SET_PDEATHSIG), so a crashed or killed
test run leaves nothing behind; one started by `make testbed-up` must outlive
its launcher and does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent_preexec() -> None:
    # SIGKILL, not SIGTERM: kube-apiserver and etcd answer SIGTERM with a graceful
    # shutdown that can outlast the dead run by minutes; the data is disposable.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start argv in a new session, stdout and stderr appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent_preexec if die_with_parent else None,
        )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists"; treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_group(pid: int, *, grace_seconds: float = 10.0) -> None:
    """SIGTERM the process group led by pid, SIGKILL it after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + (grace_seconds if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not alive(pid) and not _group_alive(pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(
    check: Callable[[], bool],
    *,
    what: str,
    timeout_seconds: float,
    interval_seconds: float = 0.2,
    is_alive: Callable[[], bool] = lambda: True,
    log_path: Path | None = None,
) -> None:
    """Poll check() until it is true; fail early when the process died."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if check():
            return
        if not is_alive():
            raise RuntimeError(f"{what} exited before it was healthy{_tail(log_path)}")
        time.sleep(interval_seconds)
    raise TimeoutError(f"{what} not healthy after {timeout_seconds:.0f}s{_tail(log_path)}")


def _tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    text = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {log_path}:\n" + "\n".join(text)


def http_ok(url: str, *, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return bool(200 <= response.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False
