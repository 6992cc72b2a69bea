"""Local processes for tests and benchmarks: free ports, waiting with a
deadline, and `shoal` subcommands (sim, router, operator) started with their
output in a log file and stopped by terminate, wait, kill.

- `wait_until` polls a check until it returns something truthy or its
  deadline passes (`TimeoutError`, saying what was awaited and the last value
  seen); given the process that should bring it about, it fails at once with
  `ProcessExited` when that process is gone. `wait_http` waits for HTTP 200.
- `start_sim`, `start_router` and `start_operator` start the three shoal
  processes; `start` any command. Each returns a `LocalProcess`; leaving its
  `with` block stops it. The router gets its configuration as router.json's
  content (written beside its log and passed as `--config`) or a path, so
  callers start it from the configuration the operator would write, never
  from settings of their own.
- Children die with the thread that started them, even when the test run or
  benchmark is killed outright (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from shoal.controller.names import COMPONENT_ROUTER, LABEL_COMPONENT, ROUTER_PORT

T = TypeVar("T")

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def free_ports(count: int, *, host: str = HOST) -> list[int]:
    """`count` distinct ports free on host (all held at once while chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port(*, host: str = HOST) -> int:
    return free_ports(1, host=host)[0]


class ProcessExited(RuntimeError):
    """What was awaited cannot come any more: the process meant to bring it exited."""


def wait_until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 60.0,
    interval: float = 0.25,
    process: LocalProcess | None = None,
) -> T:
    """Poll check() until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if process is not None and not process.alive():
            raise ProcessExited(
                f"{process.name} exited with {process.returncode} before {what}{process.tail()}"
            )
        if time.monotonic() >= deadline:
            tail = process.tail() if process is not None else ""
            raise TimeoutError(
                f"timed out after {timeout:g}s waiting for {what} (last: {last!r}){tail}"
            )
        time.sleep(interval)


def http_status(url: str, *, timeout: float = 2.0) -> int | None:
    """The status of GET url; None when nothing answers."""
    try:
        return httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def wait_http(url: str, *, timeout: float = 30.0, process: LocalProcess | None = None) -> None:
    """Until GET url answers 200."""
    wait_until(
        lambda: http_status(url) == 200,
        what=f"{url} answering 200",
        timeout=timeout,
        interval=0.1,
        process=process,
    )


def ready_router(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The URL of the first of these pods that is a shoal router answering
    /ready at its pod IP (where the testbed's pod runner serves it)."""
    return next(_ready_routers(pods), None)


def ready_routers(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The URLs of all of these pods that are shoal routers answering /ready."""
    return list(_ready_routers(pods))


def _ready_routers(pods: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if labels.get(LABEL_COMPONENT) == COMPONENT_ROUTER and ip:
            url = f"http://{ip}:{ROUTER_PORT}"
            if http_status(url + "/ready") == 200:
                yield url


def wait_scraped(router: str, engines: Sequence[str], *, timeout: float = 10.0) -> None:
    """Until the router at `router` has scraped every engine and seen it idle:
    one it has not scraped yet counts as fully loaded (so a test that kills
    one at once could find it never tried, and a benchmark's first requests
    would all avoid it)."""
    idle = [
        f'shoal_router_load_score{{replica="{url.removeprefix("http://")}"}} 0.0' for url in engines
    ]

    def scraped() -> bool:
        try:
            metrics = httpx.get(router + "/metrics", timeout=5).text
        except httpx.HTTPError:
            return False
        return all(line in metrics for line in idle)

    wait_until(scraped, what=f"{router} to scrape every engine", timeout=timeout, interval=0.1)


@dataclass(eq=False, kw_only=True)
class LocalProcess:
    """A child process with its output in `log`, and where it serves."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    urls: tuple[str, ...] = ()
    group: bool = False  # in a session of its own: signals reach its whole group
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL on stop()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_http(self, path: str, *, timeout: float = 30.0) -> None:
        """Until every URL it serves answers 200 at path (say "/health")."""
        for url in self.urls:
            wait_http(url + path, timeout=timeout, process=self)

    def wait_exit(self, *, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would, and reap it."""
        self._signal(signal.SIGKILL)
        self.popen.wait()

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after the grace period; the exit status."""
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        return self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        """Its log's last lines, to append to an error."""
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- last lines of {self.log}:\n" + "\n".join(text)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.popen.pid, sig)
            else:
                self.popen.send_signal(sig)

    def __enter__(self) -> LocalProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start(
    argv: Sequence[str],
    *,
    log: Path,
    name: str = "",
    urls: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
    grace: float = 10.0,
) -> LocalProcess:
    """argv, its stdout and stderr appended to log. new_session: in a process
    group of its own, stopped as a group (a server that forks workers)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=new_session,
            preexec_fn=_die_with_parent,
        )
    return LocalProcess(
        name=name or Path(argv[0]).name,
        popen=popen,
        log=log,
        urls=tuple(urls),
        group=new_session,
        grace=grace,
    )


def start_shoal(
    args: Sequence[str],
    *,
    log: Path,
    urls: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    grace: float = 10.0,
) -> LocalProcess:
    """`shoal ARGS...` from this interpreter; prefix runs it under another
    command (say `taskset -c 0`)."""
    return start(
        [*prefix, sys.executable, "-m", "shoal.cli", *args],
        log=log,
        name=f"shoal {args[0]}" if args else "shoal",
        urls=urls,
        env=env,
        grace=grace,
    )


def start_sim(args: Sequence[str], *, log: Path, listen: Sequence[str] = ()) -> LocalProcess:
    """One `shoal sim` process with an engine at each `listen` address
    (HOST:PORT); without any, where args say (--host, --port)."""
    flags = [flag for address in listen for flag in ("--sim-listen", address)]
    return start_shoal(
        ["sim", *args, *flags], log=log, urls=[f"http://{address}" for address in listen]
    )


def start_router(
    *,
    log: Path,
    config: Mapping[str, Any] | Path | None = None,
    endpoints: Sequence[str] = (),
    port: int | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    log_level: str = "WARNING",
) -> LocalProcess:
    """`shoal router` on HOST:port (a free port by default). config is
    router.json's content (written beside the log, as log's name with .json)
    or a router.json's path; None runs the router on its own defaults.
    endpoints are static replicas (--endpoints); for discovery, pass its
    flags in args."""
    port = port or free_port()
    argv = ["router", "--host", HOST, "--port", str(port), "--log-level", log_level]
    if isinstance(config, Path):
        argv += ["--config", str(config)]
    elif config is not None:
        written = log.with_suffix(".json")
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(json.dumps(config))
        argv += ["--config", str(written)]
    if endpoints:
        argv += ["--endpoints", ",".join(endpoints)]
    return start_shoal(
        [*argv, *args], log=log, urls=[f"http://{HOST}:{port}"], env=env, prefix=prefix
    )


def start_operator(
    *,
    kubeconfig: Path,
    namespaces: Sequence[str],
    log: Path,
    args: Sequence[str] = (),
    log_level: str = "INFO",
) -> LocalProcess:
    """`shoal operator` watching the namespaces matching the patterns (all,
    given none), with kubeconfig's credentials."""
    argv = ["operator", "--log-level", log_level]
    for pattern in namespaces:
        argv += ["--namespace", pattern]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    # kopf stops its daemons and timers on SIGTERM before it exits.
    return start_shoal([*argv, *args], log=log, env=env, grace=20.0)
