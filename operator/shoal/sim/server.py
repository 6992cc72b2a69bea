"""Serving engines: start-up, the listening socket, crash and exit.

The socket is bound at once but listens only after the simulated model load
(`--sim-startup-seconds`), so connections are refused meanwhile, as vLLM's
are. A crash fails every request and turns /health to 503; the listener
closes `crash_exit_seconds` later (real vLLM's API server exits ~3.7 s after
its engine core dies), and a process whose engines have all gone exits.
SIGTERM drains as vLLM's --shutdown-timeout says (`EngineServer.drain`).

Many engines share one event loop: `run_engines()` is the Python API that
`shoal sim` and the tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web

from shoal.sim.app import EngineApp
from shoal.sim.config import EngineConfig
from shoal.sim.engine import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"expected IP:PORT, got {text!r}")
        return cls(host.strip("[]") or "0.0.0.0", int(port))


class EngineServer:
    """One simulated vLLM server: an engine and its HTTP listener."""

    def __init__(self, config: EngineConfig, address: Address) -> None:
        self.config = config
        self.engine = Engine(config)
        self.app = EngineApp(self.engine, on_crash=self.crash, on_refuse=self.refuse)
        self.host = address.host
        self._sock = self._bind(address.port)
        self.port: int = self._sock.getsockname()[1]
        self.ready = asyncio.Event()
        self.gone = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._refusing: asyncio.Task[None] | None = None
        self._timers: list[asyncio.TimerHandle] = []

    def _bind(self, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, port))
        sock.setblocking(False)
        return sock

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _real(self, simulated_seconds: float) -> float:
        return simulated_seconds / self.config.time_scale

    async def start(self) -> None:
        """Load (refusing connections), then listen."""
        await asyncio.sleep(self._real(self.config.startup_seconds))
        # handler_cancellation: a client that leaves aborts its request, as in
        # vLLM; a short shutdown_timeout, so requests hung by a fault do not
        # hold a stopping process for aiohttp's default minute.
        self._runner = web.AppRunner(
            self.app.build(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        await self._listen()
        self.engine.start()
        loop = asyncio.get_running_loop()
        if self.config.hang_after is not None:
            delay = self._real(self.config.hang_after)
            self._timers.append(loop.call_later(delay, self.engine.set_hang, True))
        if self.config.crash_after is not None:
            self._timers.append(loop.call_later(self._real(self.config.crash_after), self.crash))
        self.ready.set()
        log.info("engine ready at %s (profile %s)", self.url, self.config.profile.name)

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.SockSite(self._runner, self._sock)
        await self._site.start()

    def refuse(self, seconds: float) -> None:
        """The "refuse_seconds" fault: stop listening (new connections are
        refused; open ones carry on), then listen again on the same port."""
        self._refusing = asyncio.get_running_loop().create_task(self._refuse(seconds))

    async def _refuse(self, seconds: float) -> None:
        site, self._site = self._site, None
        if site is None:
            return  # refusing already, or stopping
        log.warning("engine at %s refuses connections for %g s (simulated)", self.url, seconds)
        await site.stop()  # closes the listening socket
        await asyncio.sleep(seconds)
        if self._runner is None or self.gone.is_set():
            return
        self._sock = self._bind(self.port)
        await self._listen()
        log.info("engine at %s listens again", self.url)

    def crash(self) -> None:
        if self.engine.dead:
            return
        log.warning("engine at %s crashed (simulated)", self.url)
        self.engine.die()
        loop = asyncio.get_running_loop()
        loop.call_later(
            self._real(self.config.crash_exit_seconds),
            lambda: loop.create_task(self.stop()),
        )

    async def drain(self) -> None:
        """SIGTERM, as vLLM takes it: with --shutdown-timeout N, new requests
        fail (500) while those in flight run to their end, N seconds at most
        (wall clock); then, or at once with 0 (vLLM aborts them), stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_timeout
        if self.config.shutdown_timeout and self.ready.is_set() and not self.engine.dead:
            log.info("engine at %s drains %d requests", self.url, self.app.in_flight)
            self.app.shutting_down = True
            while self.app.in_flight and loop.time() < deadline:  # noqa: ASYNC110 - bounded
                await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._sock.close()
        self.gone.set()


@contextlib.asynccontextmanager
async def run_engines(
    engines: Sequence[tuple[EngineConfig, Address]], *, wait_ready: bool = True
) -> AsyncIterator[list[EngineServer]]:
    """Start engines in this event loop; stop them on exit.

    Ports may be 0 (the OS picks; read `server.port`). With wait_ready
    False the context is entered at once, while engines are still loading."""
    servers = [EngineServer(config, address) for config, address in engines]
    starting = [asyncio.create_task(s.start()) for s in servers]
    try:
        if wait_ready:
            await asyncio.gather(*starting)
        yield servers
    finally:
        for task in starting:
            task.cancel()
        await asyncio.gather(*starting, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in servers if not s.gone.is_set()))
