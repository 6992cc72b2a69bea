"""`kubectl logs` on the testbed's kwok nodes: the API server asks the node's
kubelet endpoint (kwok's server), which reads the CRI-format log files the pod
runner writes for each container it plays. What a user sees:
- `kubectl logs` shows the container's stdout and stderr, `--tail` its last
  lines, and `-f` keeps printing what it prints later;
- `kubectl logs --previous` shows the container that ran before a restart
  (and `kubectl get pod` reads CrashLoopBackOff while it waits for it);
- a pod that ran to completion keeps its logs (a Job's, say);
- both keep working for pods started before and after an API server restart,
  and a container that exits while the API server is down is reported (exit
  code, CrashLoopBackOff) once it is back, with its one process kept."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shoal_testbed.cluster import Testbed, bin_dir
from tests.e2e.kube import AFTER_API_RESTART_SECONDS, apply, get_json, namespace, run_pod, wait_for

pytestmark = pytest.mark.e2e


def _status(bed: Testbed, ns: str, pod: str) -> dict[str, Any]:
    found = get_json(bed, "pod", pod, "-n", ns)["status"].get("containerStatuses") or [{}]
    status: dict[str, Any] = found[0]
    return status


def _running(bed: Testbed, ns: str, pod: str) -> bool:
    return "running" in _status(bed, ns, pod).get("state", {})


def _logs(bed: Testbed, ns: str, pod: str, *flags: str) -> str:
    return bed.kubectl("logs", pod, "-n", ns, *flags, check=False)


def _wait_for_file(path: Path) -> str:
    return f"while not os.path.exists({str(path)!r}): time.sleep(0.05)"


def _touch_once_down(bed: Testbed, path: Path) -> None:
    """Create path once the API server stops answering (within 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if bed.kubectl("get", "--raw", "/readyz", check=False) == "":
            path.touch()
            return
        time.sleep(0.1)


def test_kubectl_logs_shows_what_the_container_printed_and_follows_it(
    testbed: Testbed, tmp_path: Path
) -> None:
    # Each line waits for the test to see the one before: stdout and stderr
    # are two pipes, copied as they come, with no order between them.
    second, go = tmp_path / "second", tmp_path / "go"
    script = "\n".join(
        [
            "import os, sys, time",
            "print('to stdout: first')",
            _wait_for_file(second),
            "print('to stderr: second', file=sys.stderr)",
            _wait_for_file(go),
            "print('to stdout: after the go')",
            "time.sleep(600)",
        ]
    )
    with namespace(testbed, "logs") as ns:
        apply(testbed, ns, run_pod("talker", script))
        wait_for(
            lambda: "to stdout: first" in _logs(testbed, ns, "talker"),
            what="talker's stdout in kubectl logs",
            timeout=60,
        )
        second.touch()
        wait_for(
            lambda: "to stderr: second" in _logs(testbed, ns, "talker"),
            what="talker's stderr in kubectl logs",
            timeout=30,
        )
        assert _logs(testbed, ns, "talker").splitlines() == [
            "to stdout: first",
            "to stderr: second",
        ]
        assert _logs(testbed, ns, "talker", "--tail=1").splitlines() == ["to stderr: second"]

        kubectl = [str(bin_dir() / "kubectl"), f"--kubeconfig={testbed.kubeconfig}"]
        follow = subprocess.Popen(
            [*kubectl, "logs", "-f", "talker", "-n", ns],
            stdout=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert follow.stdout is not None
        stdout = follow.stdout

        def pump() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        try:
            assert lines.get(timeout=30).strip() == "to stdout: first"
            assert lines.get(timeout=30).strip() == "to stderr: second"
            go.touch()
            assert lines.get(timeout=30).strip() == "to stdout: after the go"
        finally:
            follow.kill()
            follow.wait()


def test_kubectl_logs_previous_shows_the_container_that_ran_before_the_restart(
    testbed: Testbed, tmp_path: Path
) -> None:
    attempts = tmp_path / "attempts"
    # The first attempt exits 1; the one kubelet's backoff starts 10 s later stays.
    script = "; ".join(
        [
            "import os, sys, time",
            f"n = os.path.getsize({str(attempts)!r}) if os.path.exists({str(attempts)!r}) else 0",
            f"open({str(attempts)!r}, 'a').write('x')",
            "print(f'attempt {n}')",
            "sys.exit(1) if n == 0 else time.sleep(600)",
        ]
    )
    with namespace(testbed, "previous") as ns:
        apply(testbed, ns, run_pod("flaky", script))
        wait_for(
            lambda: (
                _status(testbed, ns, "flaky").get("state", {}).get("waiting", {}).get("reason")
                == "CrashLoopBackOff"
            ),
            what="flaky in CrashLoopBackOff",
            timeout=60,
        )
        columns = testbed.kubectl("get", "pod", "flaky", "-n", ns).splitlines()[1].split()
        assert columns[2] == "CrashLoopBackOff", columns
        # While it waits, kubectl logs (as kubelet) shows the container that exited.
        assert _logs(testbed, ns, "flaky").splitlines() == ["attempt 0"]
        assert _logs(testbed, ns, "flaky", "--previous").splitlines() == ["attempt 0"]
        wait_for(
            lambda: (
                _running(testbed, ns, "flaky") and _status(testbed, ns, "flaky")["restartCount"]
            ),
            what="flaky restarted and running",
            timeout=60,
        )
        wait_for(
            lambda: _logs(testbed, ns, "flaky").splitlines() == ["attempt 1"],
            what="the running attempt's output",
            timeout=30,
        )
        assert _logs(testbed, ns, "flaky", "--previous").splitlines() == ["attempt 0"]


def test_a_pod_that_ran_to_completion_keeps_its_logs_until_it_is_deleted(
    testbed: Testbed,
) -> None:
    pod = run_pod("once", "print('did the job')")
    pod["spec"]["restartPolicy"] = "Never"
    with namespace(testbed, "done") as ns:
        apply(testbed, ns, pod)
        wait_for(
            lambda: (
                get_json(testbed, "pod", "once", "-n", ns)["status"].get("phase") == "Succeeded"
            ),
            what="once Succeeded",
            timeout=60,
        )
        # Past the runner's next passes: what it does with a finished pod.
        time.sleep(2)
        assert _logs(testbed, ns, "once").splitlines() == ["did the job"]
        # Deleted, its kwok Logs object goes too.
        testbed.kubectl("delete", "pod", "once", "-n", ns, "--wait=true")
        wait_for(
            lambda: testbed.kubectl("get", "logs.kwok.x-k8s.io", "-n", ns, "-o", "name") == "",
            what="once's Logs object deleted",
            timeout=30,
        )


def test_logs_and_reports_survive_an_api_server_restart(testbed: Testbed, tmp_path: Path) -> None:
    crash = tmp_path / "crash"
    steady = "import time; print('steady since before', flush=True); time.sleep(600)"
    doomed = "\n".join(
        ["import os, sys, time", _wait_for_file(crash), "print('exiting 4')", "sys.exit(4)"]
    )
    with namespace(testbed, "apilogs") as ns:
        apply(testbed, ns, run_pod("steady", steady), run_pod("doomed", doomed))
        wait_for(
            lambda: _running(testbed, ns, "steady") and _running(testbed, ns, "doomed"),
            what="steady and doomed running",
            timeout=60,
        )
        wait_for(
            lambda: "steady since before" in _logs(testbed, ns, "steady"),
            what="steady's output",
            timeout=30,
        )
        # The API server goes down; the doomed container exits while it is.
        # (The restart runs on this thread: the API server dies with the
        # thread that started it, PR_SET_PDEATHSIG being per thread.)
        trigger = threading.Thread(target=_touch_once_down, args=(testbed, crash), daemon=True)
        trigger.start()
        testbed.restart_apiserver(down_seconds=4)
        trigger.join(timeout=5)
        assert crash.exists(), "the API server was never seen down"

        status = wait_for(
            lambda: (
                (s := _status(testbed, ns, "doomed")).get("lastState", {}).get("terminated") and s
            ),
            what="doomed's exit reported after the restart",
            timeout=60,
        )
        assert status["lastState"]["terminated"]["exitCode"] == 4
        assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert _logs(testbed, ns, "doomed").splitlines() == ["exiting 4"]
        # The steady container kept its one process: no restart, its output once.
        assert _status(testbed, ns, "steady")["restartCount"] == 0
        assert _logs(testbed, ns, "steady").splitlines() == ["steady since before"]
        # A pod created after the restart is run and its logs are served too,
        # once kwok's informer has caught up (AFTER_API_RESTART_SECONDS).
        apply(testbed, ns, run_pod("later", "import time; print('later'); time.sleep(600)"))
        wait_for(
            lambda: _logs(testbed, ns, "later").splitlines() == ["later"],
            what="later's output",
            timeout=AFTER_API_RESTART_SECONDS,
        )
