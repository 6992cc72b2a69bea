"""The operator before and under a Lease (shoal.controller.lease): a
stand-in liveness endpoint while it waits (for the API server, then to
lead), and kopf run only while the Lease is held."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from shoal.controller.election import RETRY_SECONDS
from shoal.controller.lease import LeaseLock

log = logging.getLogger("shoal.controller.lease")

T = TypeVar("T")


@contextlib.asynccontextmanager
async def waiting_liveness(url: str | None, waiting: Callable[[], str]) -> AsyncIterator[None]:
    """Answer the liveness probe, saying what for, while waiting for the API
    server or the Lease: a standby is alive, and kubelet must not restart it.
    kopf binds the same address once it runs, so this server is gone by then."""
    if url is None:
        yield
        return
    parts = urlsplit(url)

    async def alive(_: web.Request) -> web.Response:
        return web.json_response({"waiting": waiting()})

    app = web.Application()
    app.router.add_get(parts.path or "/", alive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname, parts.port or 80, reuse_address=True).start()
    try:
        yield
    finally:
        await runner.cleanup()


def lease_wait(lock: LeaseLock) -> str:
    """What a standby waits for, as its liveness answer says."""
    return f"for {lock}, held by {lock.holder or 'nobody yet'}"


class ApiWait:
    """The API server's answer to a first request, waited for: an operator
    restarted while the control plane is away (it lost its Lease to the
    outage, or its node rebooted) that exited instead would be restarted
    on kubelet's growing back-off, and come back minutes after the API
    server did."""

    def __init__(self) -> None:
        self.last = "no answer yet"

    def __str__(self) -> str:
        return f"for the Kubernetes API ({self.last})"

    async def answer(self, ask: Callable[[], Awaitable[T]], stop: asyncio.Event) -> T | None:
        """ask() until the API server answers it; None when stopped first."""
        while True:
            try:
                return await ask()
            except OSError as error:  # unreachable or silent; a refusal is ApiError
                if str(error) != self.last:
                    log.warning("waiting for the Kubernetes API: %s", error)
                self.last = str(error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_SECONDS)
            if stop.is_set():
                log.info("stopped while waiting for the Kubernetes API")
                return None


def stop_on_signals() -> asyncio.Event:
    """An Event that SIGTERM and SIGINT set from now on, to be kopf's stop
    flag too. A standby must handle them itself: as a container's PID 1 it
    ignores them by default, and kubelet would wait out the grace period. And
    one handler from here until kopf puts its own in place leaves no moment
    at which a signal is lost (kopf would then run until killed, the Lease
    unreleased)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def wait_to_lead(lock: LeaseLock, stop: asyncio.Event) -> bool:
    """Wait for the Lease; False when stopped first, the Lease released if
    taken meanwhile."""
    waiting = asyncio.ensure_future(lock.acquire())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, stopping):
            task.cancel()
        await asyncio.gather(waiting, stopping, return_exceptions=True)
    if stop.is_set():
        log.info("stopped while waiting for %s", lock)
        await lock.release()
        return False
    waiting.result()
    return True


async def run_holding(lock: LeaseLock, operator: Callable[[], Awaitable[None]]) -> None:
    """Run the operator while renewing the Lease. The Lease lost: the
    operator is cancelled (kopf cancels its handlers) and LeaseLost raised.
    The operator stopped (SIGTERM): the Lease is released, so a waiting
    operator takes over at once."""
    running = asyncio.ensure_future(operator())
    holding = asyncio.ensure_future(lock.hold())
    try:
        await asyncio.wait({running, holding}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        first = holding if holding.done() else running
        for task in (running, holding):
            task.cancel()
        await asyncio.gather(running, holding, return_exceptions=True)
    if first is holding:
        holding.result()  # raises LeaseLost
    await lock.release()
    running.result()
