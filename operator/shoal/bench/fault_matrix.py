"""The fault matrix's runs: three simulated engines (one process each, so one
can be killed or stopped), one router in front of them, an open-loop load
of streamed completions through it, and one fault injected into one engine
(or into the clients) for a while, then cleared. What the clients saw and
what the router's metrics said meanwhile become a `fault_plan.Verdict`.

Used by tests/integration/test_router_fault_matrix.py (one test case per
fault) and `make bench-faults` (shoal.bench.faults)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from shoal.api.router import RouterSettings
from shoal.bench.fault_plan import (
    SPECS,
    Fault,
    FaultSpec,
    RequestOutcome,
    RouterSample,
    Verdict,
    verdict,
)
from shoal.procs import HOST, LocalProcess, free_ports, start_router, start_sim, wait_until
from shoal.router.breaker import CircuitState
from shoal.router.metrics import REQUESTS

MODEL = "m"
REPLICA_HEADER = "x-shoal-replica"
POISON = "POISONED-PROMPT"
# The matrix's router: a breaker that opens after two failures and probes
# after one second; deadlines short enough for seconds-long runs, yet long
# enough that healthy engines on a loaded 2-core machine (one chunk a
# second at worst) never miss them.
MATRIX_ROUTER: dict[str, Any] = {
    "replicaHeader": True,  # the clients learn who served them
    "retries": 2,
    "circuitBreaker": {"failureThreshold": 2, "openSeconds": 1},
    "scrapeTimeoutMilliseconds": 1000,
    "timeouts": {
        "connectSeconds": 2,
        "firstByteSeconds": 4,
        "stallSeconds": 3,
        "totalSeconds": 60,
    },
}


def settings_of(config: dict[str, Any]) -> RouterSettings:
    return RouterSettings.model_validate(config)


@dataclass(frozen=True, kw_only=True)
class Load:
    """An open-loop load: requests leave every 1/rate seconds whatever
    happens to earlier ones."""

    rate: float = 4.0
    max_tokens: int = 8
    request_timeout: float = 60.0
    poison_every: int = 0  # every n-th request carries the poison text (0: none)


class Engines:
    """Three (or `count`) simulated engines, each its own process on a fixed
    port, so a killed one can be started again where the router expects it."""

    def __init__(self, tmp: Path, *, count: int = 3, time_scale: float = 20.0) -> None:
        self.tmp = tmp
        self.args = [
            "--served-model-name",
            MODEL,
            "--sim-time-scale",
            str(time_scale),
            "--sim-fault-api",
            # Serving at once: a restarted engine's wait is the process's start only.
            "--sim-startup-seconds",
            "0",
        ]
        self.time_scale = time_scale
        self.ports = free_ports(count)
        self.processes: list[LocalProcess] = []
        self.starts = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://{HOST}:{port}" for port in self.ports]

    def name(self, index: int) -> str:
        """The replica's name at the router (static endpoints: host:port)."""
        return f"{HOST}:{self.ports[index]}"

    def start(self) -> None:
        self.processes = [self._start(i) for i in range(len(self.ports))]
        for process in self.processes:
            process.wait_http("/health", timeout=60)

    def _start(self, index: int, *, listen_after: float = 0.0) -> LocalProcess:
        self.starts += 1
        log = self.tmp / f"sim-{index}-{self.starts}.log"
        # The "model load" is in engine seconds: time_scale of them a wall second.
        loading = ["--sim-startup-seconds", str(listen_after * self.time_scale)]
        return start_sim([*self.args, *loading], log=log, listen=[f"{HOST}:{self.ports[index]}"])

    def restart(self, index: int, *, listen_after: float = 0.0) -> None:
        """Start a killed engine again on its port; it listens once
        `listen_after` (wall) seconds passed: its port refuses meanwhile, as
        a dead process's does, and its slow start overlaps the fault."""
        self.processes[index] = self._start(index, listen_after=listen_after)

    def wait_healthy(self, index: int) -> None:
        self.processes[index].wait_http("/health", timeout=60)

    def signal(self, index: int, sig: signal.Signals) -> None:
        os.kill(self.processes[index].pid, sig)

    def set_fault(self, index: int, **fault: Any) -> None:
        httpx.post(self.urls[index] + "/_sim/fault", json=fault, timeout=5).raise_for_status()

    def heal(self) -> None:
        """Every engine alive, running and fault-free, for the next case."""
        for index, process in enumerate(self.processes):
            if not process.alive():
                self.restart(index)
                self.wait_healthy(index)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        for index, url in enumerate(self.urls):
            wait_until(
                functools.partial(_fault_api, url),
                what=f"engine {index}'s fault API",
                timeout=15,
                interval=0.1,
            )
            self.set_fault(
                index,
                hang=False,
                error_rate=0.0,
                metrics="ok",
                connections="ok",
                poison="",
                stall_after=0,
            )

    def running(self) -> float:
        """Requests running or waiting on all engines together."""
        total = 0.0
        for url in self.urls:
            for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
                if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.stop()

    def __enter__(self) -> Engines:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _fault_api(url: str) -> bool:
    try:
        return httpx.get(url + "/_sim/fault", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def matrix_router(
    engines: Engines, tmp: Path, *, config: dict[str, Any], name: str
) -> Iterator[str]:
    with start_router(log=tmp / f"{name}.log", config=config, endpoints=engines.urls) as front:
        front.wait_http("/ready", timeout=60)
        yield front.url


# ---- watching the router


def _sample(front: str, replica: str, started: float) -> RouterSample | None:
    try:
        text = httpx.get(front + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    circuit = CircuitState.CLOSED
    failed = 0.0
    label = f'replica="{replica}"'
    for line in text.splitlines():
        if label not in line:
            continue
        if line.startswith("shoal_router_circuit_state{"):
            circuit = CircuitState(int(float(line.rsplit(" ", 1)[1])))
        elif line.startswith(REQUESTS + "_total{") and 'code="5' in line:
            failed += float(line.rsplit(" ", 1)[1])
    return RouterSample(at=time.perf_counter() - started, circuit=circuit, failed_attempts=failed)


class Watch:
    """Samples the router's view of one replica every `interval` in a thread."""

    def __init__(self, front: str, replica: str, started: float, interval: float = 0.1) -> None:
        self.samples: list[RouterSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(front, replica, started, interval), daemon=True
        )

    def _run(self, front: str, replica: str, started: float, interval: float) -> None:
        while not self._stop.is_set():
            sample = _sample(front, replica, started)
            if sample is not None:
                self.samples.append(sample)
            self._stop.wait(interval)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# ---- misbehaving clients


def _stream_request(front: str, *, max_tokens: int, prompt: str, rcvbuf: int = 0) -> socket.socket:
    host, port = front.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


@dataclass
class ClientFaults:
    """Clients that leave mid-stream, or read slowly, during the fault."""

    fault: Fault
    front: str
    until: float  # perf_counter time the fault clears
    left: int = 0
    slow_answers: list[bytes] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        if self.fault is Fault.CLIENT_DISCONNECTS:
            self._threads = [threading.Thread(target=self._leaver, daemon=True)]
        else:
            self._threads = [
                threading.Thread(target=self._slow, args=(i,), daemon=True) for i in range(3)
            ]
        for thread in self._threads:
            thread.start()

    def _leaver(self) -> None:
        leaving: list[threading.Thread] = []
        i = 0
        while time.perf_counter() < self.until:
            leaving.append(threading.Thread(target=self._leave, args=(i,), daemon=True))
            leaving[-1].start()
            i += 1
            time.sleep(0.2)
        for thread in leaving:
            thread.join(timeout=30)

    def _leave(self, i: int) -> None:
        with contextlib.suppress(OSError):
            sock = _stream_request(self.front, max_tokens=400, prompt=f"leaving {i}")
            with sock:
                sock.recv(256)  # the first bytes, then away
            self.left += 1

    def _slow(self, i: int) -> None:
        # A small receive window and slow reads: the router's writes back up
        # to the engine, and no gap it sees is the engine's stall.
        answer = bytearray()
        with contextlib.suppress(OSError):
            sock = _stream_request(
                self.front, max_tokens=800, prompt=f"slow reader {i}", rcvbuf=4096
            )
            with sock:
                while time.perf_counter() < self.until:
                    piece = sock.recv(1024)
                    if not piece:
                        break
                    answer += piece
                    time.sleep(0.1)
                while piece := sock.recv(1 << 16):
                    answer += piece
        self.slow_answers.append(bytes(answer))

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)


# ---- the load


async def _one(
    session: aiohttp.ClientSession,
    front: str,
    *,
    index: int,
    load: Load,
    started: float,
) -> RequestOutcome:
    poisoned = bool(load.poison_every) and index % load.poison_every == 0
    prompt = f"user {index % 7} asks question {index}: " + "context " * (index % 11)
    if poisoned:
        prompt = f"{POISON} {prompt}"
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": load.max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    sent = time.perf_counter() - started
    replica: str | None = None
    error: str | None = None
    done = False
    chunks = 0
    try:
        async with session.post(
            front + "/v1/completions",
            json=body,
            timeout=aiohttp.ClientTimeout(total=load.request_timeout),
        ) as response:
            replica = response.headers.get(REPLICA_HEADER)
            if response.status != 200:
                error = f"HTTP {response.status}: {(await response.text())[:200]}"
            else:
                async for line in response.content:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif b'"error"' in line:
                        error = "error event: " + line.decode(errors="replace")[:200]
                    elif line.startswith(b"data: ") and b'"text"' in line:
                        chunks += 1
                if error is None and not done:
                    error = "the stream ended early"
    except (aiohttp.ClientError, TimeoutError) as failure:
        error = f"{type(failure).__name__}: {failure}"
    return RequestOutcome(
        index=index,
        sent=sent,
        ended=time.perf_counter() - started,
        ok=error is None,
        replica=replica,
        error=error,
        poisoned=poisoned,
        chunks=chunks,
    )


async def open_loop(
    front: str,
    *,
    load: Load,
    started: float,
    stop: threading.Event,
    on_outcome: Callable[[RequestOutcome], None] = lambda _: None,
) -> list[RequestOutcome]:
    """Send a request every 1/rate seconds until `stop`, then wait for all."""

    async def one(index: int) -> RequestOutcome:
        outcome = await _one(session, front, index=index, load=load, started=started)
        on_outcome(outcome)
        return outcome

    tasks: list[asyncio.Task[RequestOutcome]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        index = 0
        while not stop.is_set():
            due = started + index / load.rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(index)))
            index += 1
        return list(await asyncio.gather(*tasks))


# ---- one case


@dataclass(frozen=True, kw_only=True)
class Timeline:
    warm: float = 1.0  # load before the fault
    fault: float = 3.0  # how long the fault lasts (at least)
    after: float = 1.0  # load after the replica is back (or its back bound passed)


@dataclass
class CaseRun:
    verdict: Verdict
    outcomes: list[RequestOutcome]
    samples: list[RouterSample]
    fault_at: float
    clear_at: float
    slow_answers: list[bytes]
    clients_left: int


def _inject(engines: Engines, fault: Fault, faulted: int, fault_seconds: float) -> None:
    if fault is Fault.SIGKILL:
        engines.processes[faulted].kill()
        engines.restart(faulted, listen_after=fault_seconds)
    elif fault is Fault.SIGSTOP:
        engines.signal(faulted, signal.SIGSTOP)
    elif fault is Fault.HANG:
        engines.set_fault(faulted, hang=True)
    elif fault is Fault.REFUSED:
        engines.set_fault(faulted, refuse_seconds=fault_seconds)
    elif fault is Fault.RESET:
        engines.set_fault(faulted, connections="reset")
    elif fault is Fault.ERRORS:
        engines.set_fault(faulted, error_rate=0.5)
    elif fault is Fault.METRICS_HANG:
        engines.set_fault(faulted, metrics="hang")
    elif fault is Fault.METRICS_500:
        engines.set_fault(faulted, metrics="error")
    elif fault is Fault.METRICS_GARBAGE:
        engines.set_fault(faulted, metrics="garbage")
    elif fault is Fault.REQUEST_500:
        for index in range(len(engines.ports)):
            engines.set_fault(index, poison=POISON)
    elif fault is Fault.STALL:
        engines.set_fault(faulted, stall_after=2)


def _clear(engines: Engines, fault: Fault, faulted: int) -> None:
    if fault is Fault.SIGKILL:
        engines.wait_healthy(faulted)
    elif fault is Fault.SIGSTOP:
        engines.signal(faulted, signal.SIGCONT)
    elif fault is Fault.REFUSED:
        # It lifts itself after refuse_seconds: cleared once it listens again.
        wait_until(
            lambda: _fault_api(engines.urls[faulted]),
            what="the engine listening again",
            timeout=15,
            interval=0.05,
        )
    elif fault is Fault.REQUEST_500:
        for index in range(len(engines.ports)):
            engines.set_fault(index, poison="")
    elif fault not in (Fault.CLIENT_DISCONNECTS, Fault.SLOW_CLIENTS):
        engines.heal()


def run_case(
    fault: Fault,
    *,
    engines: Engines,
    front: str,
    faulted: int = 0,
    load: Load | None = None,
    timeline: Timeline | None = None,
    back_within: float = 10.0,
    out_within: float | None = None,
) -> CaseRun:
    """One fault under load: warm, inject, hold (at least `out_within`, the
    time the router has to take the replica out), clear, then load on until
    the replica served again (or `back_within` passed), plus `after`."""
    spec: FaultSpec = SPECS[fault]
    load = load or Load(poison_every=4 if spec.on_every_engine else 0)
    timeline = timeline or Timeline()
    if out_within is not None:
        timeline = dataclasses.replace(timeline, fault=max(timeline.fault, out_within + 0.5))
    name = engines.name(faulted)
    stop = threading.Event()
    started = time.perf_counter()
    moments: dict[str, float] = {}
    clients = ClientFaults(fault=fault, front=front, until=started + timeline.warm + timeline.fault)
    served_after = threading.Event()

    def drive_faults() -> None:
        try:
            time.sleep(timeline.warm)
            moments["fault"] = time.perf_counter() - started
            if fault in (Fault.CLIENT_DISCONNECTS, Fault.SLOW_CLIENTS):
                clients.start()
            else:
                _inject(engines, fault, faulted, timeline.fault)
            time.sleep(max(0.0, started + timeline.warm + timeline.fault - time.perf_counter()))
            _clear(engines, fault, faulted)
            moments["clear"] = time.perf_counter() - started
            served_after.wait(back_within)
            time.sleep(timeline.after)
        finally:
            stop.set()

    def seen(outcome: RequestOutcome) -> None:
        # The replica serving a request sent after the clearing ends the wait.
        clear_at = moments.get("clear")
        ok = outcome.ok and outcome.replica == name
        if ok and clear_at is not None and outcome.sent >= clear_at:
            served_after.set()

    faults = threading.Thread(target=drive_faults, daemon=True)
    with Watch(front, name, started) as watch:
        faults.start()
        outcomes = asyncio.run(
            open_loop(front, load=load, started=started, stop=stop, on_outcome=seen)
        )
        faults.join(timeout=60)
    clients.join()
    return CaseRun(
        verdict=verdict(
            spec=spec,
            outcomes=outcomes,
            samples=watch.samples,
            faulted=name,
            fault_at=moments["fault"],
            clear_at=moments["clear"],
        ),
        outcomes=outcomes,
        samples=watch.samples,
        fault_at=moments["fault"],
        clear_at=moments["clear"],
        slow_answers=clients.slow_answers,
        clients_left=clients.left,
    )


def outcomes_summary(outcomes: Sequence[RequestOutcome]) -> str:
    failed = [o for o in outcomes if not o.ok]
    return "\n".join(f"{o.index} sent {o.sent:.2f} {o.replica} {o.error}" for o in failed[:20])
