"""One operator at a time: leader election on a coordination.k8s.io Lease,
as client-go does it. Two operators reconciling the same clusters act twice:
each restarts a hung replica, replaces one for a rollout by its own count of
what is in flight, runs the warm-up and posts every Event. A second operator
comes from a second pod (a partitioned node's pod still running, or standby
replicas), or from someone running `shoal operator` beside the chart's.

A candidate takes the Lease when it is free, released, or its holder has not
renewed it for its leaseDurationSeconds, timed on the candidate's own clock
from when it last saw the record change (so clocks need not agree). The
holder renews it every RETRY_SECONDS, and gives up when it could not for
RENEW_DEADLINE_SECONDS, before any candidate may take it. Every write carries
the resourceVersion it read, so two candidates cannot both win."""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import time
import uuid
from collections.abc import Callable

from shoal.controller.election import (
    API_VERSION,
    KIND,
    RENEW_DEADLINE_SECONDS,
    RETRY_SECONDS,
    Record,
    claimed,
    held_by_other,
    micro_time,
    record_of,
)
from shoal.controller.identity import Manifest
from shoal.controller.kube import ApiError, KubeApi

log = logging.getLogger("shoal.controller.lease")


def _now() -> str:
    return micro_time(datetime.datetime.now(datetime.UTC))


# Reads and writes a release may take when others write the Lease meanwhile,
# and how long: a stopping pod must not wait on an API server that hangs.
RELEASE_TRIES = 3
RELEASE_SECONDS = 5.0


def own_identity() -> str:
    """The pod's name (its hostname) and a random part: a restarted container
    is a new candidate, not the holder it replaced."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaseLost(Exception):
    """The holder could not renew the Lease in time, or another took it."""


class LeaseLock:
    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        name: str,
        *,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self._clock = clock
        self._seen: Record | None = None
        self._seen_at = 0.0
        self._held_since = 0.0  # when our last successful write was sent

    @property
    def holder(self) -> str | None:
        """Who held it when last read."""
        return self._seen.holder if self._seen is not None else None

    def __str__(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    async def try_take(self) -> bool:
        """One attempt to take or renew it; whether we hold it now. A success
        is timed from before the request: candidates time our term from when
        they see the write, which cannot be earlier."""
        sent = self._clock()
        lease = await self.kube.get(API_VERSION, KIND, self.namespace, self.name)
        held = await self._create() if lease is None else await self.write_claim(lease)
        if held:
            self._held_since = sent
        return held

    async def write_claim(self, lease: Manifest) -> bool:
        """Take or renew the Lease as read, unless another live operator holds
        it or it changed since; whether we hold it now."""
        record = record_of(lease)
        if record != self._seen:
            self._seen, self._seen_at = record, self._clock()
        if held_by_other(record, me=self.identity, unchanged_for=self._clock() - self._seen_at):
            return False
        body = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": claimed(record, me=self.identity, now=_now()),
        }
        try:
            await self.kube.patch(API_VERSION, KIND, self.namespace, self.name, body)
        except ApiError as error:
            if error.status == 409:  # another wrote it first: read again
                return False
            raise
        if record.holder != self.identity:
            log.info("%s taken as %s (it was %s)", self, self.identity, record.holder or "free")
        return True

    async def _create(self) -> bool:
        manifest = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": claimed(None, me=self.identity, now=_now()),
        }
        try:
            await self.kube.create(manifest)
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        log.info("%s created and taken as %s", self, self.identity)
        return True

    async def acquire(self) -> None:
        """Wait until we hold it."""
        waiting_for: str | None = None
        while True:
            try:
                if await self.try_take():
                    return
            except (ApiError, OSError) as error:
                log.warning("%s: %s; trying again", self, error)
            holder = self.holder
            if holder != waiting_for and holder:
                log.info("%s is held by %s: waiting to take it over", self, holder)
                waiting_for = holder
            await asyncio.sleep(RETRY_SECONDS)

    async def hold(self) -> None:
        """Renew it until it is lost; then raise LeaseLost. As client-go's,
        every attempt is cut off at the renew deadline: a request that hangs
        (a blackholed connection) must not keep us acting until a candidate
        takes over."""
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            left = self._held_since + RENEW_DEADLINE_SECONDS - self._clock()
            try:
                async with asyncio.timeout(max(left, 0.0)):
                    if await self.try_take():
                        continue
                why = f"{self.holder or 'another operator'} holds it"
            except TimeoutError:
                why = f"not renewed within the renew deadline ({RENEW_DEADLINE_SECONDS} s)"
            except (ApiError, OSError) as error:
                why = str(error)
            taken = self.holder not in (None, "", self.identity)
            if taken or self._clock() - self._held_since >= RENEW_DEADLINE_SECONDS:
                raise LeaseLost(f"{self} lost: {why}")
            log.warning("%s not renewed: %s; trying again", self, why)

    async def release(self) -> None:
        """Let a successor take it at once, if it is still ours. Read first:
        others write the Lease too (`helm upgrade` its labels, as it replaces
        our pod), and a write carrying our own last version would be refused.
        Read even with no write of ours seen: one cut off as we stopped may
        have taken it."""
        try:
            async with asyncio.timeout(RELEASE_SECONDS):
                await self._release()
        except (ApiError, OSError) as error:  # TimeoutError is one
            # Unreachable or refused: it expires by itself.
            log.info("%s not released: %s", self, str(error) or "no answer in time")

    async def _release(self) -> None:
        for _ in range(RELEASE_TRIES):
            lease = await self.kube.get(API_VERSION, KIND, self.namespace, self.name)
            if lease is None or record_of(lease).holder != self.identity:
                log.debug("%s not ours to release", self)
                return
            body = {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
            }
            try:
                await self.kube.patch(API_VERSION, KIND, self.namespace, self.name, body)
            except ApiError as error:
                if error.status == 409:  # written meanwhile: read again
                    continue
                raise
            log.info("%s released", self)
            return
        log.info("%s not released: it kept changing", self)
