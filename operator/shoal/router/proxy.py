"""The request path: authenticate, parse, choose a replica, proxy (streaming
chunk by chunk), retry on another replica only before any byte was sent.

Only memory is read here: signals come from the background scraper, replicas
from discovery."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from shoal.router.blame import the_requests_failure
from shoal.router.breaker import Outcome
from shoal.router.config import RouterConfig
from shoal.router.dispatch import Proxied
from shoal.router.errors import error_response, internal_error, sse_error
from shoal.router.fleet import Fleet, Replica
from shoal.router.hold import HeldRequests
from shoal.router.hot import HotPrefixes
from shoal.router.incoming import Answer, BodyTooLarge, Incoming, Streamed
from shoal.router.keys import Keys
from shoal.router.metrics import RouterMetrics
from shoal.router.placements import PlacementLog
from shoal.router.policy import Choice, Chooser, RequestFacts
from shoal.router.prefix import PrefixKey, hash_text, prefix_key, request_facts
from shoal.router.progress import Progress
from shoal.router.relay import ChunkRelay
from shoal.router.routes import Refusal
from shoal.router.routes import plan as plan_request
from shoal.router.tracing import NOT_TRACED, Tracing
from shoal.router.upstream import Exchange, Pool, UpstreamError, UpstreamTimeout, request_head

log = logging.getLogger("shoal.router")

# Which replica answered, with replicaHeader on: for debugging, and for tests
# and benchmarks that count placements.
REPLICA_HEADER = "x-shoal-replica"
# Kept from the client or generated, sent to the engine, and returned.
REQUEST_ID_HEADER = "X-Request-Id"
# A client's request id is echoed in a header and logged: printable ASCII of
# a sane length, or a new one is made.
_REQUEST_ID = re.compile(r"[!-~]{1,128}")
# W3C trace context, forwarded as it came.
_TRACE_HEADERS = ("traceparent", "tracestate")
# An engine's answer headers the client does not get: RFC 9110's hop-by-hop
# fields (section 7.6.1, plus the ones it names as in use; those listed in
# Connection too), and the ones the router sets itself: the framing of the
# body it writes (content-length) and its own date and server.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_ROUTER_OWN = frozenset({"content-length", "date", "server"})
_DROPPED = _HOP_BY_HOP | _ROUTER_OWN


class UpstreamFailed(Exception):
    """A replica failed before any byte of its answer reached the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OtherKeyFirst(UpstreamFailed):
    """The engine refused the router's key, and it holds another the engine
    may take (the one before a rotation): the same replica is asked again
    with that one (`key`, an index into Proxy.engine_keys)."""

    def __init__(self, key: int) -> None:
        super().__init__("engine_key_refused")
        self.key = key


class ServerError(Exception):
    """A replica answered a server error (5xx) before any byte reached the
    client. Whose fault it is waits on another replica's answer, so the
    attempt's verdict is left to the caller."""

    def __init__(self, *, replica: Replica, ticket: int, response: web.Response) -> None:
        super().__init__(f"status_{response.status}")
        self.replica = replica
        self.ticket = ticket
        self.response = response


def _said(error: ServerError) -> tuple[int, bytes]:
    body = error.response.body
    return error.response.status, body if isinstance(body, bytes) else b""


class Proxy:
    def __init__(
        self,
        *,
        config: RouterConfig,
        fleet: Fleet,
        metrics: RouterMetrics,
        api_keys: Keys,
        hot: HotPrefixes | None,
        placements: PlacementLog | None = None,
    ) -> None:
        self.config = config
        # Parsed once: a quantity parsed per request was 5% of the router's CPU.
        self.max_body_bytes = config.max_body_bytes
        self.fleet = fleet
        self.metrics = metrics
        self.api_keys = api_keys
        self.hot = hot
        self.placements = placements  # this router's decisions, for its peers
        self.tracing: Tracing | None = None  # set when tracing is on
        self.chooser = Chooser(config)
        # The Authorization lines engines are sent: the engine key, and the
        # one before it (engines take a rotated key only when they restart).
        self.engine_keys: tuple[bytes, ...] = (b"",)
        self.capacity_changed = asyncio.Condition()
        self.waiting = 0
        self.inflight = 0
        self.held = HeldRequests()  # while no replica is routable (scaled to zero)
        # Completions go through this pool, one for the life of the process,
        # with no cap per engine (the engines queue themselves, and the router
        # bounds admission).
        self.pool = Pool(connect_seconds=config.timeouts.connect_seconds)
        # The rest (/v1/models, merged from the replicas) through aiohttp's.
        self.session: aiohttp.ClientSession | None = None
        # Kept: asyncio.get_running_loop() is a getpid() system call on 3.11.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ids = ""  # random hex digits, 32 per request id
        self._next_id = 0

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60),
            # Fetches for many clients: a cookie one engine answer set must
            # not ride along on later requests, and no compression is asked for.
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept-Encoding",),
            auto_decompress=False,
        )

    async def close(self) -> None:
        self.pool.close()
        if self.session is not None:
            await self.session.close()

    async def notify_capacity(self) -> None:
        if self.held and self.fleet.routable():
            self.held.release()
        async with self.capacity_changed:
            self.capacity_changed.notify_all()

    def set_engine_key(self, key: bytes | None) -> None:
        """The key engines are sent (replacing the client's, the router's own).
        A changed key may change every engine's answer: the breakers that
        engines refusing the old one opened are tried again at once, not
        left open for openSeconds while the new key would be taken."""
        authorization = b"Authorization: Bearer %s\r\n" % key if key else b""
        if authorization == self.engine_keys[0]:
            return
        before = self.engine_keys[0]
        self.engine_keys = (authorization, before) if before else (authorization,)
        for replica in self.fleet.replicas.values():
            # Each is sent the key it took, now the one before, until it
            # refuses it; one on the key before that is sent the new one.
            replica.key = 1 if replica.key == 0 and before else 0
        self.fleet.recheck()

    # ---- request path
    def authorized(self, request: Incoming) -> bool:
        if not self.api_keys:
            return True
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        # Header bytes that are not UTF-8 arrive as surrogates: compare them as bytes.
        return self.api_keys.accepts(token.strip().encode("utf-8", "surrogateescape"))

    async def handle(self, request: Incoming, target: Proxied) -> Answer:
        given = request.headers.get(REQUEST_ID_HEADER)
        request_id = given if given and _REQUEST_ID.fullmatch(given) else self._new_id()
        try:
            with (
                NOT_TRACED if self.tracing is None else self.tracing.request(request, request_id)
            ) as traced:
                response = await self._handle(request, target, request_id)
                traced.answered(response.status)
        except Exception as error:
            response = internal_error(request, error)
        if isinstance(response, web.Response):  # a stream got it with its headers
            response.headers[REQUEST_ID_HEADER] = request_id
        return response

    def _new_id(self) -> str:
        """32 random hex digits, as uuid4().hex; not a counter, which engines
        would show clients in their answers' ids. The random bytes come 256
        ids at a time: os.urandom is a system call."""
        at = self._next_id
        if at >= len(self._ids):
            self._ids = os.urandom(16 * 256).hex()
            at = 0
        self._next_id = at + 32
        return self._ids[at : at + 32]

    def _identity(self, request: Incoming, request_id: str) -> bytes:
        """Header lines the engine gets about the client's request. Values
        arrive as the server parsed them (no CR or LF), surrogate-escaped."""
        headers = request.headers
        lines = [b"X-Request-Id: %s\r\n" % request_id.encode()]
        # Traced, the router's own spans are the engine's parents (per attempt).
        for name in _TRACE_HEADERS if self.tracing is None else ():
            value = headers.get(name)
            if value:
                lines.append(b"%s: %s\r\n" % (name.encode(), _raw(value)))
        remote = request.remote or ""
        forwarded = headers.get("X-Forwarded-For")
        lines.append(
            b"X-Forwarded-For: %s\r\n" % _raw(f"{forwarded}, {remote}" if forwarded else remote)
        )
        # One set by a proxy in front (an ingress ending TLS) is kept.
        proto = headers.get("X-Forwarded-Proto") or request.scheme
        lines.append(b"X-Forwarded-Proto: %s\r\n" % _raw(proto))
        return b"".join(lines)

    async def _handle(self, request: Incoming, target: Proxied, request_id: str) -> Answer:
        started = time.perf_counter()
        if not self.authorized(request):
            self.metrics.rejected.labels("unauthorized").inc()
            return error_response(401, "Missing or invalid API key.", param="Authorization")
        if request.headers.get("Content-Encoding", "identity").lower() != "identity":
            # Inflating would cost CPU beyond the size limit's reach (a small
            # gzip body can inflate to gigabytes): refused unread.
            self.metrics.rejected.labels("encoded").inc()
            refused = error_response(
                415, "Compressed request bodies are not accepted.", param="Content-Encoding"
            )
            refused.force_close()
            return refused
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            self.metrics.rejected.labels("too_large").inc()
            return error_response(413, f"Request body exceeds {self.config.max_body_bytes} bytes.")
        try:
            if request.body_complete():  # the whole body came with the headers
                raw = await request.read()
            else:
                # A timer, not a task: a body that trickles in (slow loris)
                # holds the connection only this long.
                async with asyncio.timeout(self.config.timeouts.client_body_seconds):
                    raw = await request.read()
        except BodyTooLarge:
            self.metrics.rejected.labels("too_large").inc()
            return error_response(413, f"Request body exceeds {self.config.max_body_bytes} bytes.")
        except TimeoutError:
            self.metrics.rejected.labels("body_timeout").inc()
            slow = error_response(
                408,
                f"The request body did not arrive within "
                f"{self.config.timeouts.client_body_seconds} seconds.",
            )
            slow.force_close()  # the rest of the body would pass for a request
            return slow
        route = target.route  # how this path is routed (router/routes.py)
        body, problem = _parse_body(raw) if route.body else ({}, None)
        if body is None:
            self.metrics.rejected.labels("bad_request").inc()
            return error_response(400, problem or "Invalid request.", param="body")
        try:
            # Values nested within the parsers' limits (orjson's 1,024 levels)
            # but past what rendering them as text may recurse: the client's.
            plan = plan_request(
                route,
                body,
                match=target.match,
                query=request.query,
                replica_ids=self.fleet.replicas.keys(),
            )
            if isinstance(plan, Refusal):
                return plan.response()
            prompt = plan.text
            decision_start = time.perf_counter()
            key = (
                prefix_key(
                    prompt,
                    block_chars=self.config.thresholds.prefix_block_chars,
                    max_blocks=self.config.thresholds.max_prefix_blocks,
                )
                if plan.cache_aware
                else PrefixKey(hashes=[], blocks=0)
            )
            session = _session_key(request, body)
        except RecursionError:
            self.metrics.rejected.labels("bad_request").inc()
            return error_response(400, NESTED_TOO_DEEPLY, param="body")
        facts = request_facts(prompt, key, self.config, session_key=session)
        decision_seconds = time.perf_counter() - decision_start
        if self.hot is not None and plan.hot_body is not None:
            self.hot.observe(prompt, key, plan.hot_body)

        stream = plan.stream
        identity = self._identity(request, request_id)
        tried: set[str] = set()
        # A replica's 5xx, held until another replica's answer says whose it
        # is: the replica's if another answers, the request's if it recurs.
        held: ServerError | None = None
        held_outcome = Outcome.NONE
        attempts = self.config.retries + 1
        last_failure = "no replica available"
        if self.config.queue.zero_replica_wait_seconds and not self.fleet.routable():
            turned_away = await self._hold_at_zero()
            if turned_away is not None:
                return turned_away
        try:
            for attempt in range(attempts):
                t0 = time.perf_counter()
                # A pinned request (stored state) counts the others as tried.
                tried |= plan.excluded(self.fleet.replicas.keys())
                choice, anyone = self.fleet.decide(
                    self.chooser, key, facts, exclude=frozenset(tried)
                )
                decision_seconds += time.perf_counter() - t0
                if choice is None and not anyone:
                    # Nobody left to try (none routable, breakers open, or all
                    # tried already): queueing would only delay the answer.
                    break
                if choice is None:
                    with NOT_TRACED if self.tracing is None else self.tracing.queued():
                        waited = await self._wait_for_capacity(key, facts, tried)
                    if isinstance(waited, web.Response):
                        return waited
                    choice = waited
                if attempt == 0:
                    self.metrics.decision.observe(decision_seconds)
                    self.metrics.predicted_hit.observe(choice.predicted_hit)
                replica = self.fleet.replicas.get(choice.replica)
                if replica is None:
                    continue
                if self.tracing is not None:
                    self.tracing.routed(
                        choice,
                        replica=replica.endpoint.name,
                        policy=self.config.policy.value,
                        attempt=attempt,
                        since=t0,
                    )
                tried.add(replica.id)
                self.fleet.index.record(replica.id, key.hashes)
                if self.placements is not None:
                    self.placements.append(replica.id, key.hashes)
                try:
                    # What the replica must prefill of this prompt, as far as we know.
                    prefill = facts.prompt_tokens - choice.predicted_hit * facts.prefix_tokens
                    attempt_span = (
                        NOT_TRACED
                        if self.tracing is None
                        else self.tracing.attempt(replica.endpoint.name, attempt=attempt)
                    )
                    with attempt_span as traced:
                        forward = functools.partial(
                            self._forward,
                            request,
                            replica,
                            plan.payload(raw, replica.id),
                            request_id=request_id,
                            identity=identity + traced.header,
                            stream=stream,
                            prefill=prefill,
                        )
                        try:
                            response = await forward(key=None)
                        except OtherKeyFirst as refused:
                            response = await forward(key=refused.key)
                        traced.answered(response.status)
                except UpstreamFailed as failure:
                    last_failure = failure.reason
                    self.metrics.retries.labels(failure.reason).inc()
                    continue
                except ServerError as error:
                    if held is not None:
                        if the_requests_failure(_said(held), _said(error)):
                            # The same request failed so on a second replica:
                            # the request's failure, counted against neither.
                            self.fleet.verdict(error.replica, error.ticket, Outcome.NONE)
                            self.metrics.requests.labels("none", str(error.response.status)).inc()
                            return error.response
                        # Each replica's own (engines dead, or shutting down):
                        # the first is still held for the client, if no one answers.
                        self.fleet.verdict(error.replica, error.ticket, Outcome.FAILED)
                    else:
                        held = error
                    self.metrics.retries.labels(str(error)).inc()
                    continue
                # Another replica answered: the held 5xx was its replica's.
                held_outcome = Outcome.FAILED
                self.metrics.latency.observe(time.perf_counter() - started)
                return response
            if held is not None:
                # Nobody else to ask: the engine's own answer, and its failure.
                held_outcome = Outcome.FAILED
                return held.response
        finally:
            if held is not None:
                self.fleet.verdict(held.replica, held.ticket, held_outcome)
        self.metrics.requests.labels("none", "503").inc()
        if not tried:
            return error_response(503, "No replica is ready to serve requests.")
        return error_response(
            503, f"No replica could take the request ({last_failure}); try again."
        )

    async def _hold_at_zero(self) -> web.Response | None:
        """No replica to route to: hold the request, in arrival order, until one
        is routable (None) or queue.zeroReplicaWaitSeconds passed (a 503)."""
        queue = self.config.queue
        if self.waiting >= queue.max_queued:
            self.metrics.rejected.labels("queue_full").inc()
            return error_response(
                429,
                "No replica is running and the queue is full; retry later.",
                headers={"Retry-After": str(queue.retry_after_seconds)},
            )
        started = time.monotonic()
        self.waiting += 1
        self.metrics.queue_depth.set(self.waiting)
        try:
            released = await self.held.wait(queue.zero_replica_wait_seconds)
        finally:
            self.waiting -= 1
            self.metrics.queue_depth.set(self.waiting)
        self.metrics.zero_wait.observe(time.monotonic() - started)
        if released:
            return None
        self.metrics.rejected.labels("zero_replicas").inc()
        self.metrics.requests.labels("none", "503").inc()
        return error_response(
            503,
            f"No replica started within {queue.zero_replica_wait_seconds} seconds; retry later.",
            headers={"Retry-After": str(queue.retry_after_seconds)},
        )

    async def _wait_for_capacity(
        self, key: PrefixKey, facts: RequestFacts, tried: set[str]
    ) -> Choice | web.Response:
        """Every replica is saturated: wait in the bounded admission queue."""
        queue = self.config.queue
        if self.waiting >= queue.max_queued:
            self.metrics.rejected.labels("queue_full").inc()
            return error_response(
                429,
                "All replicas are saturated and the queue is full; retry later.",
                headers={"Retry-After": str(queue.retry_after_seconds)},
            )
        deadline = time.monotonic() + queue.max_wait_seconds
        self.waiting += 1
        self.metrics.queue_depth.set(self.waiting)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.metrics.rejected.labels("queue_timeout").inc()
                    return error_response(
                        429,
                        "All replicas stayed saturated; retry later.",
                        headers={"Retry-After": str(queue.retry_after_seconds)},
                    )
                async with self.capacity_changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self.capacity_changed.wait(), timeout=min(remaining, 0.5)
                        )
                choice, _ = self.fleet.decide(self.chooser, key, facts, exclude=frozenset(tried))
                if choice is not None:
                    return choice
        finally:
            self.waiting -= 1
            self.metrics.queue_depth.set(self.waiting)

    async def _forward(
        self,
        request: Incoming,
        replica: Replica,
        raw: bytes,
        *,
        request_id: str,
        identity: bytes,
        stream: bool,
        prefill: float,
        key: int | None,
    ) -> Answer:
        """One attempt. Its verdict on the replica is given here (at the
        latest in `finally`, Outcome.NONE when it says nothing), except for a
        5xx, whose verdict goes to the caller with the ServerError. `key`
        None: the replica is sent the key it took, and on a refusal
        OtherKeyFirst names the other to ask again with; else that one."""
        name = replica.endpoint.name
        series = self.metrics.series(replica)
        ticket = self.fleet.begin(replica, prefill_tokens=prefill)
        pending = [prefill]  # cleared when the first output shows the prefill done

        def prefilled() -> None:
            if pending:
                self.fleet.prefilled(replica, pending.pop())

        def first_output(status: int) -> None:
            if stream and status == 200:
                # A stream's first body bytes carry its first token; its
                # headers come before the prefill (from vLLM as from the sim).
                series.ttft.observe(time.perf_counter() - sent_at)
            prefilled()

        self.inflight += 1
        sent_at = time.perf_counter()
        timeouts = self.config.timeouts
        loop = self.loop or asyncio.get_running_loop()
        now = loop.time()
        deadline = now + timeouts.total_seconds
        first_byte_by = min(now + timeouts.first_byte_seconds, deadline)
        # A plain answer's head comes with its end: waited for while the engine generates.
        extend = None
        if not stream:
            extend = Progress(
                read=replica.progress,
                clock=loop.time,
                step=timeouts.first_byte_seconds,
                deadline=deadline,
            ).extend
        sent = replica.key if key is None else key
        exchange: Exchange | None = None
        verdict: Outcome | None = Outcome.NONE  # still to give; None once given
        try:
            try:
                # The exchange keeps the deadline (no asyncio timer per request).
                exchange, status, headers = await self._send(
                    replica,
                    request.raw_path_qs,
                    raw,
                    method=request.method,
                    identity=identity + self.engine_keys[sent],
                    on_first=first_output,
                    answer_by=first_byte_by,
                    extend=extend,
                )
            except UpstreamTimeout as error:
                verdict = Outcome.FAILED
                series.requests(504).inc()  # retried elsewhere, but the replica failed
                raise UpstreamFailed("first_byte_timeout") from error
            except UpstreamError as error:
                verdict = Outcome.FAILED
                series.requests(502).inc()
                raise UpstreamFailed("connect_error") from error
            if status == HTTPStatus.UNAUTHORIZED:
                # The router sent its engine key in place of the client's: a
                # refusal is the replica's (another key, as while a rotated
                # Secret reaches the engines one restart at a time), retried
                # elsewhere; never an "invalid key" for a client whose was good.
                series.requests(status).inc()
                if key is None and len(self.engine_keys) > 1:
                    # The other key of the one sent: concurrent refusals all
                    # agree on it, whatever order they come back in.
                    replica.key = 1 - sent
                    verdict = Outcome.NONE  # the key's fault, not the replica's
                    raise OtherKeyFirst(1 - sent)
                verdict = Outcome.FAILED
                raise UpstreamFailed("engine_key_refused")
            if not (stream and status == 200):
                exchange.disarm()
            if status >= 500:
                try:
                    answer = await self._whole(exchange, status, headers, deadline=deadline)
                    if answer is None:
                        # An error past what the router holds (no engine's
                        # runs to megabytes) cannot wait for a retry's
                        # verdict: taken as a broken answer.
                        raise UpstreamFailed("broken_answer")
                except UpstreamFailed:
                    verdict = Outcome.FAILED
                    series.requests(502).inc()
                    raise
                series.requests(status).inc()
                verdict = None
                raise ServerError(replica=replica, ticket=ticket, response=answer)
            if stream and status == 200:
                # An engine sends a stream's headers before its first token,
                # and a hung one nothing after them: nothing reaches the
                # client before the first body bytes, so until then a
                # failure is retried elsewhere, and headers alone are no
                # success.
                try:
                    await exchange.begun
                except UpstreamTimeout as error:
                    verdict = Outcome.FAILED
                    series.requests(504).inc()
                    raise UpstreamFailed("first_byte_timeout") from error
                except UpstreamError as error:
                    verdict = Outcome.FAILED
                    series.requests(502).inc()
                    raise UpstreamFailed("broken_answer") from error
            # The engine answered (a 4xx is the request's). A half-open probe
            # gives its verdict now, so it closes the breaker without waiting
            # for the end of its stream (its own later failure reopens it).
            # Any other gives one verdict, at its end: an OK now would reset
            # the count of failures that its own break then adds to, so
            # streams that all break after their first bytes never opened it.
            verdict = Outcome.OK
            if replica.breaker.probe == ticket:
                self.fleet.verdict(replica, ticket, Outcome.OK)
                verdict = None
            response: Answer | None = None
            if not (stream and status == 200):
                try:
                    response = await self._whole(exchange, status, headers, deadline=deadline)
                except UpstreamFailed:
                    verdict = Outcome.FAILED
                    series.requests(502).inc()
                    raise
                if response is not None and response.status == 504:
                    verdict = Outcome.FAILED
            if response is None:  # a stream, or an answer too large to hold
                exchange.disarm()
                response, failure = await self._stream(
                    request,
                    exchange,
                    status,
                    headers,
                    request_id=request_id,
                    first_chunk_by=first_byte_by,
                    deadline=deadline,
                    events=stream,
                )
                if failure is not None:
                    verdict = Outcome.FAILED
                    log.warning("answer from %s broke after its first byte: %s", name, failure)
            series.requests(response.status).inc()
            return response
        except asyncio.CancelledError:
            # The client went away: the connection is dropped below, so the
            # engine aborts the request and frees its KV blocks.
            series.requests(499).inc()
            raise
        finally:
            if exchange is not None:
                # Back to the pool only if the answer was read whole; otherwise
                # (the client gone, a failed write, a deadline) the connection
                # is dropped, which is how the engine learns to stop.
                exchange.release()
            prefilled()
            if verdict is not None:
                self.fleet.verdict(replica, ticket, verdict)
            self.fleet.end(replica, ticket)
            self.inflight -= 1
            if self.waiting:  # nobody queued: nobody to wake
                loop.create_task(self.notify_capacity())

    async def _send(
        self,
        replica: Replica,
        path: str,
        raw: bytes,
        *,
        method: str = "POST",
        identity: bytes,
        on_first: Callable[[int], None],
        answer_by: float,
        extend: Callable[[], float | None] | None = None,
    ) -> tuple[Exchange, int, CIMultiDict[str]]:
        """Send the request and wait for the answer's status and headers,
        which must come by `answer_by`, or as `extend` puts it off (else
        UpstreamTimeout)."""
        address = self.pool.address(replica.endpoint.url)
        head = request_head(
            method.encode(),
            address.base + path.encode("utf-8", "surrogateescape"),
            address,
            len(raw),
            extra=identity,
        )
        while True:
            exchange = await self.pool.open(address, answer_by=answer_by)
            exchange.send(head + raw, on_first=on_first, answer_by=answer_by, extend=extend)
            try:
                status, raw_headers = await exchange.head
            except UpstreamTimeout:
                exchange.release()
                raise
            except UpstreamError as error:
                exchange.release()
                if exchange.reused and not error.answered:
                    # A kept-alive connection the engine closed meanwhile, not
                    # a failure of the engine: the pool drops it; try again.
                    continue
                raise
            except BaseException:
                exchange.release()
                raise
            headers: CIMultiDict[str] = CIMultiDict()
            named: frozenset[str] = frozenset()
            for k, v in raw_headers:
                if k.lower() == b"connection":
                    named |= {t.strip() for t in v.decode("latin-1").lower().split(",")}
            for k, v in raw_headers:
                name = k.decode("latin-1")
                lower = name.lower()
                if lower not in _DROPPED and lower not in named:
                    headers.add(name, v.decode("latin-1"))
            if self.config.replica_header:
                headers[REPLICA_HEADER] = replica.endpoint.name
            return exchange, status, headers

    async def _whole(
        self, exchange: Exchange, status: int, headers: CIMultiDict[str], *, deadline: float
    ) -> web.Response | None:
        """A plain answer: nothing reaches the client before its end, so an
        engine that breaks off meanwhile costs only a retry elsewhere. None
        when it outgrew what the router holds (`upstream.HOLD_ANSWER_BYTES`)
        before its end: the caller relays it as it comes."""
        done = exchange.done
        try:
            if not done.done():  # a small answer comes whole with its headers: no timer
                async with asyncio.timeout_at(deadline):
                    await exchange.filled()
                if not done.done():
                    return None
            done.result()
        except UpstreamError as error:
            raise UpstreamFailed("broken_answer") from error
        except TimeoutError:
            total = self.config.timeouts.total_seconds
            return error_response(504, f"The replica did not answer within {total:g} seconds.")
        return web.Response(status=status, body=exchange.body(), headers=headers)

    async def _stream(
        self,
        request: Incoming,
        exchange: Exchange,
        status: int,
        headers: CIMultiDict[str],
        *,
        request_id: str,
        first_chunk_by: float,
        deadline: float,
        events: bool,
    ) -> tuple[Streamed, str | None]:
        """Relay an answer as it comes; the second value says why it broke
        off after its first byte. Then a client of an event stream (`events`)
        gets an SSE error event; of a plain answer, its connection is cut
        before the body's end, which HTTP/1.1 clients report as an
        incomplete answer (an HTTP/1.0 client, whose body the connection's
        end ends, gets the engine's Content-Length to compare with)."""
        headers[REQUEST_ID_HEADER] = request_id  # sent now, with the first bytes
        # A stream's headers wait for its first chunk, to go out in one write
        # with it: one system call and one client wake-up fewer per stream,
        # on the path to the first token. The megabytes held of a plain
        # answer go out as the relay's chunks, not joined in one more copy.
        held = exchange.take() if events else b""
        # A plain answer's body goes out as the engine sends it: its length too.
        request.stream_head(status, headers, held, length=None if events else exchange.length)
        # From here each network read from the engine is written to the
        # client in the same callback (no task switch per chunk); this task
        # only waits for the end.
        stall = self.config.timeouts.stall_seconds
        if exchange.begun.done():
            # Body bytes came already (a stream's first chunk was awaited
            # before its headers went out): the next are due within the
            # stall deadline.
            first_chunk_by = exchange.loop.time() + stall
        relay = ChunkRelay(
            request.transport,
            exchange,
            request.drain,
            chunked=request.chunked,
            stall_seconds=stall,
            first_chunk_by=first_chunk_by,
            deadline=deadline,
        )
        exchange.attach(relay)
        failure: str | None = None
        try:
            await exchange.done
        except UpstreamError as error:
            failure = relay.failure or f"The replica's stream broke off ({error})."
        except Exception as error:
            internal_error(request, error)
            failure = "The router failed on this stream."
        finally:
            relay.stop()
        if failure is not None:
            if events:
                # What OpenAI clients raise on (an error object in the data);
                # the blank lines end any event the engine left cut short.
                request.stream_write(sse_error(502, failure))
            else:
                request.transport.abort()  # no last chunk: the body is unfinished
        return Streamed(status), failure


def _raw(value: str) -> bytes:
    """A header value as the client sent its bytes."""
    return value.encode("utf-8", "surrogateescape")


def _session_key(request: Incoming, body: dict[str, Any]) -> int | None:
    session = request.headers.get("x-session-id") or body.get("user")
    return hash_text(str(session)) if session else None


def _parse_body(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        # orjson: 3-8x faster than json on request bodies (0.4 against 3.4 us
        # for a small completion, 10 against 35 us for a 15 kB chat). It reads
        # any valid JSON as json does, except integers beyond 64 bits (floats);
        # what it refuses goes to json, which the router's answer keeps to
        # (json accepts NaN, Infinity, a BOM and lone surrogates).
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _parse_body_strictly(raw)
    return _checked(body)


NESTED_TOO_DEEPLY = "Request body is nested too deeply."


def _parse_body_strictly(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        body = json.loads(raw)
    except RecursionError:
        return None, NESTED_TOO_DEEPLY
    except ValueError as error:
        # Where it broke, not the bytes there: nothing of the request is echoed.
        # A ValueError of its own: an integer past Python's 4,300 digits.
        return None, f"Request body is not valid JSON ({type(error).__name__})."
    return _checked(body)


def _checked(body: Any) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(body, dict):
        return None, "Request body must be a JSON object."
    if not body.get("model"):
        return None, "you must provide a model parameter"
    if "messages" in body and not isinstance(body["messages"], list):
        return None, "'messages' must be a list of chat messages."
    return body, None
