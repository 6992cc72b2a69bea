"""The router process: HTTP app, discovery, scraper, and graceful drain."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from shoal.api.router import CLOSE_SECONDS
from shoal.engine.endpoints import MAX_ANSWER_BYTES
from shoal.router.config import RouterConfig
from shoal.router.connections import HttpServer
from shoal.router.discovery import PodWatcher, peer_urls, static_endpoints
from shoal.router.dispatch import Dispatch, Proxied
from shoal.router.errors import error_response, guarded
from shoal.router.fleet import Endpoint, Fleet, Replica
from shoal.router.heap import settle
from shoal.router.hot import HotPrefixes
from shoal.router.incoming import Answer, Incoming
from shoal.router.keys import KeyFile, Keys
from shoal.router.metrics import Listener, RouterMetrics
from shoal.router.placements import PLACEMENTS_PATH, WAIT_SECONDS, PeerSync, PlacementLog, encode
from shoal.router.prefix import checkpoints
from shoal.router.proxy import Proxy
from shoal.router.reads import loads, read_whole
from shoal.router.scrape import Scraper
from shoal.router.tracing import Tracing

log = logging.getLogger("shoal.router")

# As aiohttp's sites had it: the listen backlog.
BACKLOG = 128
# Draining, a connection idle this long between requests is closed: its
# client is not in the middle of back-to-back requests (one of which a close
# could meet), and reconnects to another router when it has one to send.
DRAIN_IDLE_SECONDS = 1.0


@dataclass
class Discovery:
    """Either a static list of URLs or Kubernetes pods by label."""

    endpoints: list[str] = field(default_factory=list)
    namespace: str | None = None
    selector: str | None = None
    engine_port: int = 8000
    # The other router replicas, whose placements this one reads: a static list
    # of their internal ports' URLs, or their pods by label (this pod, by
    # name, left out).
    peers: list[str] = field(default_factory=list)
    peer_selector: str | None = None
    pod_name: str | None = None

    @property
    def has_peers(self) -> bool:
        return bool(self.peers or self.peer_selector)


class Router:
    def __init__(
        self,
        config: RouterConfig,
        discovery: Discovery,
        key_file: KeyFile | None = None,
        *,
        engine_key_file: KeyFile | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        self.discovery = discovery
        self.key_file = key_file
        self.engine_key_file = engine_key_file
        self.metrics = RouterMetrics()
        self.fleet = Fleet(config)
        hot = config.hot_prefixes
        self.hot = (
            HotPrefixes(
                top_k=hot.max_prefixes,
                max_chars=hot.max_chars,
                block_chars=config.thresholds.prefix_block_chars,
            )
            if hot.enabled
            else None
        )
        # Kept only for peers to read: a lone router keeps nothing.
        sharing = config.share_placements and discovery.has_peers
        self.placements = PlacementLog() if sharing else None
        self.peer_sync = PeerSync(
            record=self.fleet.index.record,
            max_hashes=len(checkpoints(config.thresholds.max_prefix_blocks)),
            received=self.metrics.peer_placements.inc,
            authorization=self._peer_authorization,
            pending=self.fleet.foreign_pending,
        )
        if self.placements is not None:
            self.fleet.on_prefilled = self.placements.touch
        self.proxy = Proxy(
            config=config,
            fleet=self.fleet,
            metrics=self.metrics,
            api_keys=Keys(key_file.keys if key_file else []),
            hot=self.hot,
            placements=self.placements,
        )
        if engine_key_file is not None:
            self.proxy.set_engine_key(engine_key_file.keys[0])
        # tracing: given (tests), or as config.tracing says (None when off).
        self.tracing = tracing or Tracing.from_settings(config.tracing)
        self.proxy.tracing = self.tracing
        self.scraper = Scraper(fleet=self.fleet, metrics=self.metrics, on_change=self._after_scrape)
        self.draining = False
        self._tasks: list[asyncio.Task[None]] = []
        # Every engine route the router proxies or refuses (router/routes.py),
        # and its own.
        self.dispatch = Dispatch(
            own={
                "/v1/models": guarded(self.models),
                "/health": self.health,
                "/ready": guarded(self.ready),
                "/metrics": guarded(self.metrics_endpoint),
            }
        )
        # Probes and metrics here too: kubelet's probes and the operator's reads
        # are then apart from the clients' connections, whose bound would
        # refuse them (a router whose client port is full is no less alive).
        self.internal_dispatch = Dispatch(
            own={
                "/health": self.health,
                "/ready": guarded(self.ready),
                "/metrics": guarded(self.metrics_endpoint),
                "/hot-prefixes": guarded(self.hot_prefixes),
                PLACEMENTS_PATH: guarded(self.placements_endpoint),
            },
            table=(),
        )

    # ---- fleet changes
    def publish(self, endpoints: list[Endpoint]) -> None:
        before = {r.endpoint.name for r in self.fleet.replicas.values()}
        self.fleet.update(endpoints)
        after = {r.endpoint.name for r in self.fleet.replicas.values()}
        for name in before - after:
            self.metrics.forget(name)
        self.metrics.routable.set(len(self.fleet.routable()))
        asyncio.get_running_loop().create_task(self.proxy.notify_capacity())

    async def _after_scrape(self) -> None:
        now = time.monotonic()
        self.fleet.sweep(now)
        views = {c.replica: c for c in self.fleet.candidates(key=None)}
        for replica in self.fleet.replicas.values():
            name = replica.endpoint.name
            view = views.get(replica.id)
            self.metrics.load.labels(name).set(view.load if view is not None else 1.0)
            self.metrics.circuit.labels(name).set(int(replica.breaker.state(now)))
        await self.proxy.notify_capacity()

    # ---- lifecycle
    async def start(self) -> None:
        await self.proxy.start()
        if self.discovery.endpoints:
            self.publish(static_endpoints(self.discovery.endpoints))
        else:
            assert self.discovery.namespace and self.discovery.selector is not None
            watcher = PodWatcher(
                namespace=self.discovery.namespace,
                selector=self.discovery.selector,
                engine_port=self.discovery.engine_port,
                publish=self.publish,
            )
            self._tasks.append(asyncio.get_running_loop().create_task(watcher.run()))
        self._tasks.append(asyncio.get_running_loop().create_task(self.scraper.run()))
        if self.placements is not None:
            self._follow_peers()
        if self.key_file is not None or self.engine_key_file is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._reload_keys()))

    def _peer_authorization(self) -> str | None:
        keys = self.proxy.api_keys.keys
        return "Bearer " + keys[0].decode("utf-8", "surrogateescape") if keys else None

    def _follow_peers(self) -> None:
        if self.discovery.peers:
            self._set_peers(self.discovery.peers)
        elif self.discovery.peer_selector:
            assert self.discovery.namespace
            watcher = PodWatcher(
                namespace=self.discovery.namespace,
                selector=self.discovery.peer_selector,
                engine_port=self.config.internal_port,
                publish=lambda routers: self._set_peers(
                    peer_urls(routers, own_pod=self.discovery.pod_name)
                ),
            )
            self._tasks.append(asyncio.get_running_loop().create_task(watcher.run()))

    def _set_peers(self, urls: list[str]) -> None:
        self.peer_sync.set_peers(url.rstrip("/") for url in urls)
        self.metrics.peers.set(len(self.peer_sync.peers))

    async def _reload_keys(self) -> None:
        while True:
            await asyncio.sleep(self.config.api_key_reload_seconds)
            # A stat per period; a file is read only when it changed.
            if self.key_file is not None and self.key_file.refresh():
                self.proxy.api_keys = Keys(self.key_file.keys)
            if self.engine_key_file is not None and self.engine_key_file.refresh():
                self.proxy.set_engine_key(self.engine_key_file.keys[0])

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.peer_sync.close()
        await self.proxy.close()
        if self.tracing is not None:
            self.tracing.shutdown()  # exports the spans still batched

    async def drain(self, servers: Sequence[HttpServer]) -> None:
        """Stop being Ready and keeping connections alive, then let the requests
        in flight finish and the clients leave (at most drainSeconds): each
        answer closes its connection, and one idle for DRAIN_IDLE_SECONDS is
        closed. The listeners stay open meanwhile: a connection that still
        comes is served, not refused."""
        self.draining = True
        if self.placements is not None:
            self.placements.close()
        for served in servers:
            served.stop_keeping_alive()
        deadline = time.monotonic() + self.config.drain_seconds
        while time.monotonic() < deadline:
            for served in servers:
                served.close_idle(DRAIN_IDLE_SECONDS)
            if self.proxy.inflight + self.proxy.waiting == 0 and not any(
                served.connections for served in servers
            ):
                return
            await asyncio.sleep(0.1)

    # ---- handlers
    async def health(self, _: Incoming) -> web.Response:
        return web.Response(text="ok")

    async def ready(self, _: Incoming) -> web.Response:
        if self.draining:
            return error_response(503, "Router is draining.")
        routable = len(self.fleet.routable())
        if routable == 0 and self.config.queue.zero_replica_wait_seconds:
            # Scaled to zero: requests are held here while a replica starts,
            # so the router must stay in its Service to take them.
            return web.json_response({"status": "ready", "routable": 0})
        if routable == 0:
            return error_response(503, "No replica is ready.")
        if self.scraper.scrapes == 0:
            # Until then every replica would count as fully loaded, or some
            # would while others were already scraped: not worth a request.
            # A round ends when each scrape has answered or timed out.
            return error_response(503, "Waiting for the first scrape of the replicas' metrics.")
        return web.json_response({"status": "ready", "routable": routable})

    async def metrics_endpoint(self, _: Incoming) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def models(self, request: Incoming) -> web.Response:
        """Models served by any routable replica, merged by id."""
        if not self.proxy.authorized(request):
            self.metrics.rejected.labels("unauthorized").inc()
            return error_response(401, "Missing or invalid API key.", param="Authorization")
        assert self.proxy.session is not None
        session = self.proxy.session

        async def fetch(replica: Replica) -> list[dict[str, Any]]:
            url = replica.endpoint.url
            # The key this replica is sent (the one before a rotation, if it took that).
            line = self.proxy.engine_keys[replica.key]
            headers = dict([line.decode().rstrip("\r\n").split(": ", 1)]) if line else None
            try:
                async with session.get(
                    url + "/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=2)
                ) as response:
                    if response.status != 200:
                        return []
                    found = loads(await read_whole(response, limit=MAX_ANSWER_BYTES))
                data = found.get("data") if isinstance(found, dict) else None
                return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return []

        merged: dict[str, dict[str, Any]] = {}
        results = await asyncio.gather(*(fetch(r) for r in self.fleet.routable()))
        for models in results:
            for model in models:
                merged.setdefault(str(model.get("id")), model)
        return web.json_response({"object": "list", "data": list(merged.values())})

    async def hot_prefixes(self, request: Incoming) -> web.Response:
        if self.hot is None:
            return error_response(404, "Hot prefixes are disabled.")
        if not self.proxy.authorized(request):
            # The users' prompts: as private as the API they came through.
            return error_response(401, "Missing or invalid API key.", param="Authorization")
        return web.json_response({"prefixes": self.hot.top()})

    async def answer(self, request: Incoming) -> Answer:
        """The client port's one handler."""
        return await self._answer(self.dispatch, request)

    async def answer_internal(self, request: Incoming) -> Answer:
        """The internal port's (placements for peers, hot prefixes for warm-up)."""
        return await self._answer(self.internal_dispatch, request)

    async def _answer(self, dispatch: Dispatch, request: Incoming) -> Answer:
        target = dispatch.resolve(request.method, request.path_safe)
        if isinstance(target, Proxied):
            return await self.proxy.handle(request, target)
        return await target(request)

    def server(self, port: Listener = Listener.API) -> HttpServer:
        """An HTTP server (in a running loop) for one of the router's ports: both
        have the same deadlines and bounds, each its own connections. A client
        that disconnects cancels its handler, which closes the upstream
        connection, so the engine aborts the request too."""
        server = HttpServer(
            self.answer if port is Listener.API else self.answer_internal,
            header_seconds=self.config.timeouts.client_header_seconds,
            max_connections=self.config.max_client_connections,
            client_max_size=self.config.max_body_bytes,
        )
        self.metrics.watch_connections(port, server)
        return server

    async def placements_endpoint(self, request: Incoming) -> web.Response:
        """This router's placements after a cursor, for its peers: waits up to
        `wait` seconds (at most WAIT_SECONDS) for one when none is new."""
        if self.placements is None:
            return error_response(404, "Sharing placements is off (sharePlacements).")
        if self.draining:
            # Nothing more to give: a refusal makes readers back off as from a
            # failing peer, where an empty answer had them ask again at once.
            return error_response(503, "Router is draining.")
        if not self.proxy.authorized(request):
            # Hashes of prompt prefixes: as private as the API they came through.
            return error_response(401, "Missing or invalid API key.", param="Authorization")
        query = request.query
        try:
            after = max(int(query.get("after", "0")), 0)
            wait = min(max(float(query.get("wait", "0")), 0.0), WAIT_SECONDS)
            # Absent from a router of an older version (a rollout in progress).
            touched = max(int(query["touched"]), 0) if "touched" in query else None
        except ValueError:
            return error_response(
                400, "after and touched must be integers, wait a number of seconds."
            )
        epoch = query.get("epoch")
        if wait > 0:
            await self.placements.wait(epoch, after, wait, touched=touched)
        own = {r.id: r.pending for r in self.fleet.replicas.values()}
        return web.json_response(encode(self.placements, epoch, after, own))

    @property
    def serves_internal(self) -> bool:
        return self.hot is not None or self.placements is not None


async def serve(router: Router, *, host: str, port: int, internal: bool = False) -> None:
    """Run until SIGTERM or SIGINT, then drain and stop. internal: serve the
    internal port even when nothing else needs it (probes and metrics)."""
    await router.start()
    loop = asyncio.get_running_loop()
    servers = [router.server()]
    if internal or router.serves_internal:
        servers.append(router.server(Listener.INTERNAL))
    ports = [port, router.config.internal_port]
    listening = [
        await loop.create_server(served, host, at, backlog=BACKLOG)
        for served, at in zip(servers, ports, strict=False)
    ]
    settle()  # everything built so far lives as long as the process
    log.info("router listening on %s:%d (policy %s)", host, port, router.config.policy)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining")
    await router.drain(servers)
    for listener in listening:
        listener.close()
    for served in servers:
        await served.shutdown(CLOSE_SECONDS)
    await router.stop()
