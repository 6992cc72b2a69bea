"""The logs of engines' crashed runs, read once per run. I/O.

kubelet keeps only a log's last 2 KB as the termination message
(FallbackToLogsOnError), and vLLM's cause comes before the API server's
traceback of ~4.5 KB; so the crashed run's log is read through the API
(pods/log: the container's own while it lies terminated, else `previous`)
and what it says (`failures.last_words`) stands in for that message. A log
that cannot be read leaves the termination message."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from shoal.controller.failures import CrashedRun, last_words
from shoal.controller.identity import ClusterRef
from shoal.controller.kube import ApiError
from shoal.controller.logs import cluster_logger

# The log's end, where vLLM's cause is: its API server's wrapper and a few
# processes' tracebacks fill some hundred lines after it. limitBytes counts
# from the first of these lines, so they must fit in it.
TAIL_LINES = 300
LIMIT_BYTES = 64 * 1024


class PodLogs(Protocol):
    async def log(
        self,
        namespace: str,
        pod: str,
        *,
        container: str,
        previous: bool,
        tail_lines: int,
        limit_bytes: int,
    ) -> str: ...


async def crash_words(
    kube: PodLogs,
    ref: ClusterRef,
    runs: Sequence[CrashedRun],
    *,
    known: Mapping[CrashedRun, str | None],
) -> dict[CrashedRun, str | None]:
    """What each run's log says (None: it could not be read), for the runs
    given: those in `known` are not read again, the others are forgotten. A
    log still empty is read again at the next pass: a real kubelet answers
    so for a run that ended a moment ago."""
    words = {run: known[run] for run in runs if run in known}
    missing = [run for run in runs if run not in known]
    read = await asyncio.gather(*(_read(kube, ref, run) for run in missing))
    words.update((run, said) for run, said in zip(missing, read, strict=True) if said != "")
    return words


async def _read(kube: PodLogs, ref: ClusterRef, run: CrashedRun) -> str | None:
    """What the run's log says; "" while it is empty, None if unreadable."""
    try:
        log = await kube.log(
            ref.namespace,
            run.pod,
            container=run.container,
            previous=run.previous,
            tail_lines=TAIL_LINES,
            limit_bytes=LIMIT_BYTES,
        )
    except (ApiError, OSError) as error:
        # Gone with its pod, or kubelet removed the dead container; or RBAC
        # without pods/log: the termination message is told instead.
        cluster_logger(ref.namespace, ref.name, pod=run.pod).info(
            "cannot read the log of %s's crashed run: %s", run.container, error
        )
        return None
    return last_words(log) or ""
