"""The model cache (spec.model.cache): the shared claim and the download Job
that fills it, what the engines mount, and what a Job's state means. Pure.

Shared: the files go to `<claim>/<repo>[@<revision>]` (one directory per
model and revision, so clusters sharing a claim share downloads), written by
`shoal download` (the operator's own image: small, pulled with the
operator's pull secrets, and the same code the testbed runs) in a Job named
after that directory, `<cluster>-dl-<hash>`. The engines start only once it
completed, mount the claim read-only and load the directory offline.
Node: the engines' Hugging Face cache is a host directory; vLLM downloads
into it the first time and finds it there after."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shoal.api.cache import DownloadState, DownloadStatus
from shoal.api.engine_env import ManagedEnv
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import ConditionStatus
from shoal.controller import mounts
from shoal.controller.identity import ClusterRef, Manifest, object_meta
from shoal.controller.names import cluster_labels
from shoal.controller.pods import pull_secret_entries
from shoal.download.progress import PROGRESS_PATH, PROGRESS_PORT, Progress, describe

CACHE_MOUNT = mounts.SHARED_CACHE.path
COMPONENT_DOWNLOAD = "download"
# What the Job controller labels its pods with.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# The download needs little CPU or memory: it streams files to the volume.
DOWNLOAD_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}}


@dataclass(frozen=True)
class Download:
    """What the download Job of the current spec has done."""

    job: str
    state: DownloadState
    message: str
    attempts: int = 0  # pods that ran and failed
    progress: Progress | None = None  # what the running pod served, when it could be read

    @property
    def complete(self) -> bool:
        return self.state is DownloadState.COMPLETE


def repository(spec: VLLMClusterSpec) -> str:
    source = spec.model.source
    if source is not None and source.hf is not None and source.hf.id:
        return source.hf.id
    return spec.model.name


def revision(spec: VLLMClusterSpec) -> str | None:
    source = spec.model.source
    return source.hf.revision if source is not None and source.hf is not None else None


def uses_shared(spec: VLLMClusterSpec) -> bool:
    return spec.model.cache is not None and spec.model.cache.shared is not None


def node_cache_path(spec: VLLMClusterSpec) -> str | None:
    cache = spec.model.cache
    return cache.node.path if cache is not None and cache.node is not None else None


def model_directory(spec: VLLMClusterSpec) -> str:
    """The model's directory inside the claim: `org--name[@revision]`, as the
    Hub cache spells repositories (one path segment, no `/`)."""
    name = repository(spec).replace("/", "--")
    rev = revision(spec)
    return f"{name}@{rev.replace('/', '--')}" if rev else name


def model_path(spec: VLLMClusterSpec) -> str:
    """Where an engine finds the downloaded model (what `vllm serve` loads)."""
    return posixpath.join(CACHE_MOUNT, model_directory(spec))


def claim_name(ref: ClusterRef, spec: VLLMClusterSpec) -> str:
    cache = spec.model.cache
    given = cache.shared.claim_name if cache is not None and cache.shared is not None else None
    return given or f"{ref.name}-models"


def job_name(ref: ClusterRef, spec: VLLMClusterSpec) -> str:
    digest = hashlib.sha256(model_directory(spec).encode()).hexdigest()[:6]
    return f"{ref.name}-dl-{digest}"


def token_env(spec: VLLMClusterSpec) -> list[dict[str, Any]]:
    """HF_TOKEN from the Secret the spec names, for the Job and the engines."""
    source = spec.model.source
    token = source.hf.token_secret if source is not None and source.hf is not None else None
    if token is None:
        return []
    ref = {"name": token.name, "key": token.key}
    return [{"name": ManagedEnv.HF_TOKEN.value, "valueFrom": {"secretKeyRef": ref}}]


def build_cache_claim(ref: ClusterRef, spec: VLLMClusterSpec) -> Manifest | None:
    """The ReadWriteMany claim shoal makes, or None (no shared cache, or the user's claim)."""
    cache = spec.model.cache
    shared = cache.shared if cache is not None else None
    if shared is None or shared.claim_name:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": shared.size}},
    }
    if shared.storage_class_name is not None:
        claim_spec["storageClassName"] = shared.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(
            ref, claim_name(ref, spec), labels=cluster_labels(ref.name, COMPONENT_DOWNLOAD)
        ),
        "spec": claim_spec,
    }


def build_download_job(
    ref: ClusterRef,
    spec: VLLMClusterSpec,
    *,
    image: str,
    pull_secrets: Sequence[str] = (),
) -> Manifest | None:
    """The Job filling the shared claim, or None without a shared cache. image:
    the shoal image (the operator's); pull_secrets: the operator's. The engines'
    env (HF_ENDPOINT for a mirror, proxies) and envFrom reach it too, so it
    talks to the Hub the engines would."""
    cache = spec.model.cache
    if cache is None or cache.shared is None:
        return None
    labels = cluster_labels(ref.name, COMPONENT_DOWNLOAD)
    args = ["download", "--repo", repository(spec), "--dir", model_path(spec)]
    if (rev := revision(spec)) is not None:
        args += ["--revision", rev]
    # Its progress, read by the operator at the pod's IP (download/progress.py says why).
    args += ["--host", "0.0.0.0", "--progress-port", str(PROGRESS_PORT)]
    container: dict[str, Any] = {
        "name": "download",
        "image": image,
        "command": ["shoal"],
        "args": args,
        "env": token_env(spec) + list(spec.engine.env),
        "resources": DOWNLOAD_RESOURCES,
        "ports": [{"name": "progress", "containerPort": PROGRESS_PORT, "protocol": "TCP"}],
        "volumeMounts": [{"name": mounts.SHARED_CACHE.name, "mountPath": CACHE_MOUNT}],
        # The downloader's last line says what to change (a 401: the token).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_settings = spec.engine.pod
    if pod_settings is not None and pod_settings.env_from:
        container["envFrom"] = list(pod_settings.env_from)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [
            {
                "name": mounts.SHARED_CACHE.name,
                "persistentVolumeClaim": {"claimName": claim_name(ref, spec)},
            }
        ],
    }
    if pull_secrets:
        pod["imagePullSecrets"] = pull_secret_entries(pull_secrets)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(ref, job_name(ref, spec), labels=labels),
        "spec": {
            "backoffLimit": cache.shared.backoff_limit,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def progress_url(pods: Sequence[Manifest]) -> str | None:
    """Where the Job's running pod serves its progress; None without one."""
    for pod in pods:
        status = pod.get("status") or {}
        deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
        if status.get("phase") == "Running" and status.get("podIP") and not deleting:
            return f"http://{status['podIP']}:{PROGRESS_PORT}{PROGRESS_PATH}"
    return None


def download_state(
    job: Manifest | None,
    pods: Sequence[Manifest],
    *,
    name: str,
    progress: Progress | None = None,
) -> Download:
    """The Job's state (its conditions), with the last failed pod's words and,
    while it runs, the progress its pod served."""
    if job is None:
        return Download(name, DownloadState.PENDING, f"creating the download Job {name}")
    status = job.get("status") or {}
    failed = int(status.get("failed") or 0)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    said = _last_failure(pods)
    if (conditions.get("Complete") or {}).get("status") == ConditionStatus.TRUE:
        return Download(name, DownloadState.COMPLETE, f"Job {name} completed", failed)
    if (conditions.get("Failed") or {}).get("status") == ConditionStatus.TRUE:
        why = said or str((conditions.get("Failed") or {}).get("message") or "it failed")
        retry = f"; once fixed, `kubectl delete job {name}` and shoal runs it again"
        return Download(name, DownloadState.FAILED, f"Job {name} failed: {why}{retry}", failed)
    limit = int((job.get("spec") or {}).get("backoffLimit", 6))
    attempt = f"attempt {failed + 1} of {limit + 1}"
    if int(status.get("active") or 0) > 0:
        done = f" {describe(progress)}" if progress is not None else ""
        last = f"; the last attempt said: {said}" if said else ""
        message = f"Job {name} is downloading{done} ({attempt}){last}"
        return Download(name, DownloadState.RUNNING, message, failed, progress)
    return Download(name, DownloadState.PENDING, f"Job {name} is waiting for its pod", failed)


def _last_failure(pods: Sequence[Manifest]) -> str:
    """The termination message of the most recently finished failed pod."""
    found: list[tuple[str, str]] = []
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated and int(terminated.get("exitCode") or 0) != 0:
                message = str(terminated.get("message") or terminated.get("reason") or "")
                found.append((str(terminated.get("finishedAt") or ""), message.strip()))
    if not found:
        return ""
    lines = max(found)[1].splitlines()
    return lines[-1][:1024] if lines else ""


def download_status(download: Download) -> DownloadStatus:
    """status.model.download."""
    progress = download.progress
    return DownloadStatus(
        job=download.job,
        state=download.state,
        attempts=download.attempts,
        bytes=progress.bytes if progress is not None else None,
        total_bytes=progress.total_bytes if progress is not None else None,
        bytes_per_second=round(progress.bytes_per_second) if progress is not None else None,
        progress=describe(progress) if progress is not None else None,
    )
