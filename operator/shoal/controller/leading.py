"""The operator under a Lease (shoal.controller.lease): a stand-in liveness
endpoint while it waits to lead, and kopf run only while the Lease is held."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from shoal.controller.lease import LeaseLock

log = logging.getLogger("shoal.controller.lease")


@contextlib.asynccontextmanager
async def waiting_liveness(url: str | None, lock: LeaseLock) -> AsyncIterator[None]:
    """Answer the liveness probe while waiting for the Lease: a standby is
    alive, and kubelet must not restart it. kopf binds the same address once
    it runs, so this server is gone by then."""
    if url is None:
        yield
        return
    parts = urlsplit(url)

    async def alive(_: web.Request) -> web.Response:
        holder = lock.holder or "nobody yet"
        return web.json_response({"waiting": f"for {lock}, held by {holder}"})

    app = web.Application()
    app.router.add_get(parts.path or "/", alive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname, parts.port or 80, reuse_address=True).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def wait_to_lead(lock: LeaseLock) -> bool:
    """Wait for the Lease; False when stopped first (SIGTERM, SIGINT). kopf
    handles those signals once it runs; until then a standby must too: as a
    container's PID 1 it ignores them by default, and kubelet would wait out
    the grace period to kill it."""
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(lock.acquire())
    stops = (signal.SIGTERM, signal.SIGINT)
    for stop in stops:
        loop.add_signal_handler(stop, waiting.cancel)
    try:
        await waiting
    except asyncio.CancelledError:
        if not waiting.cancelled():
            raise  # we were cancelled, not stopped by a signal
        log.info("stopped while waiting for %s", lock)
        return False
    finally:
        for stop in stops:
            loop.remove_signal_handler(stop)
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
