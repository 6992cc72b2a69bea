"""Why a replica's containers fail, and what to do about it, from what kubelet
reports of them (observe's ContainerFacts). Pure.

- a container in CrashLoopBackOff, or whose last run failed and that is not
  running again past its startup probe, is CrashLooping: "exits with code N" (or OOMKilled), the
  last line of its termination message when there is one, a fix when that
  line names a known cause (401 from Hugging Face, an unknown flag, the KV
  cache smaller than maxModelLen, CUDA out of memory), and the pod to read
  the logs of;
- ErrImagePull, ImagePullBackOff or InvalidImageName is ImagePullFailing;
- CreateContainerConfigError (a Secret or ConfigMap key it needs is missing)
  is Misconfigured; CreateContainerError and RunContainerError CrashLooping.

And why pods are not made at all: the API server refuses them (Pod Security,
a quota, a webhook), which their StatefulSet or Deployment only reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shoal.api.status import ConditionReason, ReplicaState
from shoal.controller.observe import (
    ContainerFacts,
    ExitReason,
    PodFacts,
    ReplicaFacts,
    Waiting,
)

_PULL = (Waiting.PULL_ERROR, Waiting.PULL_BACKOFF, Waiting.INVALID_IMAGE)
_CANNOT_RUN = (Waiting.CREATE_ERROR, Waiting.RUN_ERROR)
_LINE_CHARS = 300
# The API server's refusal of a pod: Pod Security lists every field it wants.
_WORDS_CHARS = 600

# (pattern in the engine's last words, what to do), first match wins.
_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"(401|403|unauthori[sz]ed|gated repo|access to model).*"
            r"(hugging ?face|hf\.co|huggingface_hub|repo)"
            r"|(hugging ?face|hf\.co|huggingface_hub|repo).*(401|403|unauthori[sz]ed|gated)",
            re.IGNORECASE,
        ),
        "the Hugging Face Hub refused the download: set spec.model.source.hf.tokenSecret "
        "to a Secret holding a token with access to the model",
    ),
    (
        re.compile(r"unrecognized arguments|unrecognized option|no such option", re.IGNORECASE),
        "vLLM refuses a flag: check spec.engine.extraArgs",
    ),
    (
        re.compile(r"max_model_len|max model len|maxModelLen", re.IGNORECASE),
        "the KV cache cannot hold spec.engine.maxModelLen tokens: lower it, or give the "
        "KV cache more memory (spec.engine.gpuMemoryUtilization)",
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError", re.IGNORECASE),
        "the GPU ran out of memory: lower spec.engine.gpuMemoryUtilization or "
        "spec.engine.maxModelLen",
    ),
)


# (the API server's words, what to do), first match wins; {pod} is the
# spec's pod settings (spec.engine.pod or spec.router.pod).
_REFUSAL_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"violates PodSecurity"),
        "the namespace enforces a Pod Security level: set {pod}.securityContext and "
        "{pod}.containerSecurityContext as it asks (vLLM's images run as root, so the "
        "restricted level also needs an image that runs as non-root), or lower the "
        "namespace's pod-security.kubernetes.io/enforce label",
    ),
    (
        re.compile(r"exceeded quota"),
        "a ResourceQuota of the namespace is used up: raise it, or lower the pods' requests",
    ),
    (
        re.compile(r"admission webhook"),
        "an admission webhook refused them: its message above says why",
    ),
)


def refused_pods(owner: str, words: str, *, pod_settings: str) -> str:
    """Why `owner` (e.g. "StatefulSet c-r0") has no pods, and what to do."""
    fix = next(
        (text for pattern, text in _REFUSAL_HINTS if pattern.search(words)),
        f"kubectl describe {owner.lower().replace(' ', '/')}",
    )
    return f"{owner} cannot create its pods: {words[:_WORDS_CHARS]}; {fix.format(pod=pod_settings)}"


@dataclass(frozen=True)
class Failure:
    state: ReplicaState
    reason: ConditionReason  # Degraded's
    message: str  # what happened, and what to do


def last_line(text: str | None) -> str | None:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:_LINE_CHARS] if lines else None


def hint(text: str | None) -> str | None:
    for pattern, fix in _HINTS:
        if text and pattern.search(text):
            return fix
    return None


def termination(container: ContainerFacts) -> str | None:
    """'exit code 1 (Error)', 'OOMKilled (exit code 137)', or None if it never ended."""
    if container.exit_reason is ExitReason.OOM_KILLED:
        code = f" (exit code {container.exit_code})" if container.exit_code is not None else ""
        return f"OOMKilled{code}"
    if container.exit_code is None:
        return None
    return f"exit code {container.exit_code} ({container.exit_reason})"


def _crash(pod: PodFacts, container: ContainerFacts) -> Failure:
    restarts = f"{container.restarts} restart{'s' if container.restarts != 1 else ''}"
    if container.exit_reason is ExitReason.OOM_KILLED:
        return Failure(
            ReplicaState.CRASH_LOOPING,
            ConditionReason.ENGINE_OOM_KILLED,
            f"the engine of pod {pod.name} was OOMKilled ({restarts}): raise "
            "spec.engine.resources.limits.memory (vLLM stages weights in host memory)",
        )
    said = container.exit_message or container.waiting_message
    words = last_line(container.exit_message)
    exited = (
        f"exits with code {container.exit_code}"
        if container.exit_code is not None
        else "keeps exiting"
    )
    parts = [f"the engine of pod {pod.name} {exited} ({restarts})"]
    if words:
        parts.append(f'saying "{words}"')
    fix = hint(said)
    if fix:
        parts.append(fix)
    parts.append(f"see kubectl logs {pod.name} --previous")
    return Failure(
        ReplicaState.CRASH_LOOPING, ConditionReason.ENGINE_CRASH_LOOPING, ": ".join(parts)
    )


def container_failure(pod: PodFacts, container: ContainerFacts) -> Failure | None:
    waiting = container.waiting
    if waiting in _PULL:
        return Failure(
            ReplicaState.IMAGE_PULL_FAILING,
            ConditionReason.IMAGE_PULL_FAILING,
            f"image {container.image} cannot be pulled ({waiting}) for pod {pod.name}: "
            "check spec.image and the registry's credentials (imagePullSecrets)",
        )
    if waiting is Waiting.CONFIG_ERROR:
        said = container.waiting_message or "a Secret or ConfigMap it needs is missing"
        return Failure(
            ReplicaState.MISCONFIGURED,
            ConditionReason.CONTAINER_CONFIG_ERROR,
            f"pod {pod.name} cannot start: {said}: create it, or fix the reference "
            "(e.g. spec.model.source.hf.tokenSecret)",
        )
    if waiting in _CANNOT_RUN:
        return Failure(
            ReplicaState.CRASH_LOOPING,
            ConditionReason.CONTAINER_CANNOT_RUN,
            f"pod {pod.name} cannot run its engine ({waiting}): {container.waiting_message or ''}",
        )
    if container.crashed and not pod.ready:
        return _crash(pod, container)
    return None


def pod_failure(pod: PodFacts) -> Failure | None:
    for container in pod.containers:
        found = container_failure(pod, container)
        if found is not None:
            return found
    return None


def replica_failure(replica: ReplicaFacts) -> Failure | None:
    """The first failing container of the replica's pods, leader first."""
    for pod in replica.members:
        found = pod_failure(pod)
        if found is not None:
            return found
    return None


def last_termination(replica: ReplicaFacts) -> str | None:
    """How the replica's engine last exited, as its pods still record it."""
    for pod in replica.members:
        for container in pod.containers:
            found = termination(container)
            if found is not None:
                return f"pod {pod.name}: {found}"
    return None
