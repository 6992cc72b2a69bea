"""The shared model cache's I/O: read the download Job of the current spec
(and its pods, while it has not completed), make the claim and the Job when
they are missing or outdated, and say what the download has done.

Once the Job completed, a pass reads only the Job: nothing is written, so
an idle fleet with a cache still makes no writes. A Job whose template is
outdated (the engines' env changed mid-download) is deleted and made again,
as a Job's template cannot change; the files already fetched stay.
While it runs, its pod's progress is read over HTTP at the pod's IP
(download/progress.py says why), and the pass comes back every
PROGRESS_SECONDS to read it again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import ConditionStatus
from shoal.controller import cache
from shoal.controller.desired import manifest_hash
from shoal.controller.identity import ClusterRef, Manifest
from shoal.controller.kube import KubeApi
from shoal.controller.names import ANNOTATION_SPEC_HASH
from shoal.download.progress import Progress, from_json
from shoal.engine.client import EngineClient
from shoal.engine.errors import EngineError

Apply = Callable[[Manifest], Awaitable[bool]]
log = logging.getLogger(__name__)
# How often status follows a running download (a status write each time).
PROGRESS_SECONDS = 5.0
# Short: an unreachable pod must not hold up the reconciliation.
PROGRESS_DEADLINE_SECONDS = 2.0


async def prepare_model(
    kube: KubeApi,
    ref: ClusterRef,
    spec: VLLMClusterSpec,
    *,
    image: str,
    pull_secrets: Sequence[str],
    apply: Apply,
    engine: EngineClient,
) -> cache.Download | None:
    """The download's state, after making what it still needs; None without
    a shared cache. apply: the reconciler's (stamps the hash, notes refusals);
    engine: the operator's client, which reads the progress."""
    job_manifest = cache.build_download_job(ref, spec, image=image, pull_secrets=pull_secrets)
    if job_manifest is None:
        return None
    name = job_manifest["metadata"]["name"]
    claim = cache.build_cache_claim(ref, spec)
    job, found_claim = await asyncio.gather(
        kube.get("batch/v1", "Job", ref.namespace, name), _get_claim(kube, ref, claim)
    )
    # A completed download is done only while it filled the claim the spec
    # names (its Job as the spec asks) and that claim is still there: the
    # model goes with a deleted claim.
    refill = claim is not None and found_claim is None
    if job is not None and _completed(job) and not refill and not _outdated(job, job_manifest):
        return cache.download_state(job, (), name=name)
    pods = await kube.list("v1", "Pod", ref.namespace, f"{cache.JOB_NAME_LABEL}={name}")
    if claim is not None and _outdated(found_claim, claim) and not await apply(claim):
        return cache.download_state(job, pods, name=name)
    if job is None:
        await apply(job_manifest)
    elif _outdated(job, job_manifest) or (refill and _completed(job)):
        uid = (job.get("metadata") or {}).get("uid")
        await kube.delete("batch/v1", "Job", ref.namespace, name, uid=uid)
        job, pods = None, []
    url = cache.progress_url(pods)
    progress = await read_progress(engine, url) if url is not None else None
    return cache.download_state(job, pods, name=name, progress=progress)


async def read_progress(engine: EngineClient, url: str) -> Progress | None:
    """What the download pod serves; None when it cannot say (starting, an
    older image, a network policy in the way)."""
    try:
        response = await engine.get(url, deadline=PROGRESS_DEADLINE_SECONDS)
        found = from_json(response.json()) if response.status == 200 else None
    except (EngineError, ValueError) as error:
        log.debug("no download progress from %s: %s", url, error)
        return None
    return found


def _completed(job: Manifest) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "Complete" and c.get("status") == ConditionStatus.TRUE for c in conditions
    )


def _outdated(live: Manifest | None, desired: Manifest) -> bool:
    annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    return live is None or annotations.get(ANNOTATION_SPEC_HASH) != manifest_hash(desired)


async def _get_claim(kube: KubeApi, ref: ClusterRef, claim: Manifest | None) -> Manifest | None:
    if claim is None:
        return None
    return await kube.get("v1", "PersistentVolumeClaim", ref.namespace, claim["metadata"]["name"])
