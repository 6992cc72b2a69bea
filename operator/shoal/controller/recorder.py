"""Posting the operator's Events (built by `events`) through its API client.

`record` is awaited: the reconciler posts an Event before the action it
announces, so a pass killed after acting has already told its story.
`post` does the same in the background, for callers whose Event follows
what they did and need not hold it up (the autoscaler, a failed pass).
An Event that cannot be posted is logged, never raised: Events are for
people; status holds the durable facts."""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
from collections.abc import Callable
from typing import Any

import httpx

from shoal.controller.decide import Event
from shoal.controller.events import event_manifest
from shoal.controller.identity import ClusterRef
from shoal.controller.kube import ApiError, KubeApi

_log = logging.getLogger(__name__)


class EventRecorder:
    """Events on VLLMClusters; counted (by `counted`) as they are posted."""

    def __init__(
        self,
        kube: KubeApi,
        *,
        counted: Callable[[Any, Event], None] | None = None,
        instance: str | None = None,
    ) -> None:
        self._kube = kube
        self._counted = counted
        self._instance = instance or socket.gethostname()
        self._background: set[asyncio.Task[None]] = set()

    async def record(self, body: Any, event: Event) -> None:
        if self._counted is not None:
            self._counted(body, event)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        manifest = event_manifest(ClusterRef.of(body), event, now=now, instance=self._instance)
        try:
            await self._kube.create(manifest)
        except (ApiError, OSError, httpx.HTTPError) as error:
            _log.warning("could not post Event %s (%s): %s", event.reason, event.message, error)

    def post(self, body: Any, event: Event) -> None:
        """record, in the background."""
        task = asyncio.get_running_loop().create_task(self.record(body, event))
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)
