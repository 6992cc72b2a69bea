"""Keep one command running, as kubelet or systemd keeps a control-plane
component running: restart it when it exits (kube-scheduler, for one, exits
on purpose when it finds its cache inconsistent after an API server restart).

`python -m shoal_testbed.supervise -- ARGV...`; SIGTERM stops it and the child.
The child dies with the supervisor, so stopping or killing the supervisor
never leaves the component behind.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from shoal_testbed.procs import die_with_parent_preexec


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    backoff = 1.0
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(argv, preexec_fn=die_with_parent_preexec)
        code = child.wait()
        if stopping:
            return 0
        print(
            f"[supervise] {argv[0]} exited with {code}; restarting in {backoff:.0f}s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(backoff)
        # Reset the backoff after a good run; grow it while it keeps crashing.
        backoff = 1.0 if time.monotonic() - started > 30 else min(backoff * 2, 30.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
