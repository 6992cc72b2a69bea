"""Why a replica's containers fail, and what to do about it, from what kubelet
reports of them (observe's ContainerFacts). Pure.

- a container in CrashLoopBackOff, or whose last run failed and that is not
  running again past its startup probe, is CrashLooping: "exits with code N"
  (or OOMKilled), the cause its last words give (`last_words`: from the run's
  log when it was read, else from its termination message), a fix when they
  name a known cause (401 from Hugging Face, an unknown flag, the KV cache
  smaller than maxModelLen, CUDA out of memory), and the pod to read the logs
  of;
- ErrImagePull, ImagePullBackOff or InvalidImageName is ImagePullFailing;
- CreateContainerConfigError (a Secret or ConfigMap key it needs is missing)
  is Misconfigured; a container the runtime cannot start (its last run ended
  with exit code 128 and no reason of kubelet's, or it waits in
  CreateContainerError or RunContainerError) is CrashLooping with
  ContainerCannotRun, whichever waiting reason kubelet shows at the time.

Kubelet's words are quoted cut short, and a message fits a replica's status
entry.

And why pods are not made at all: the API server refuses them (Pod Security,
a quota, a webhook), which their StatefulSet or Deployment only reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from shoal.api.status import REPLICA_MESSAGE_CHARS, ConditionReason, ReplicaState
from shoal.controller.observe import (
    ContainerFacts,
    ExitReason,
    Observed,
    PodFacts,
    ReplicaFacts,
    Waiting,
)

_PULL = (Waiting.PULL_ERROR, Waiting.PULL_BACKOFF, Waiting.INVALID_IMAGE)
_CANNOT_RUN = (Waiting.CREATE_ERROR, Waiting.RUN_ERROR)
# containerd's StartError (Docker's ContainerCannotRun): the runtime could not
# start the process. A process's own exit is kubelet's Error, and a signal's
# 128+N, so 128 under another reason means it never ran (and has no log).
_NOT_STARTED_CODE = 128
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
        re.compile(r"max_model_len|max model len|max seq len|maxModelLen", re.IGNORECASE),
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


_CANNOT_RUN_FIX = (
    "check that spec.image is a vLLM image (shoal runs `vllm serve` in it); if a GPU hook "
    "failed (nvidia-container-cli), check the node's NVIDIA driver and container runtime"
)

# How vLLM prefixes each line: its process ("(EngineCore_DP0 pid=94) ",
# colored on a terminal) and its logger ("ERROR 03-09 12:57:38 [core.py:866] ").
_COLOR = re.compile(r"\x1b\[[\d;]*m")
_PROCESS = re.compile(r"^\([^()]*\bpid=\d+[^()]*\)\s?")
_RECORD = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (\[[^\]]*\]) ?"
)
# The line Python ends a traceback with: "torch.OutOfMemoryError: CUDA out of memory."
_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)(?::\s|$)")
# vLLM's processes fail in a chain, each raising an error that points to the
# one before: the API server's is last, and says only that the engine core failed.
_WRAPPER = re.compile(
    r"root cause|Engine core initialization failed|EngineCore encountered an issue",
    re.IGNORECASE,
)
# Where an exception's message ends (Python prints a message's lines as is).
_MESSAGE_END = re.compile(
    r"^(?:Traceback \(most recent call last\)|The above exception|During handling of the above"
    r"|Process \S+:$)"
)
# Lines of an exception's message kept (the Hub's 401 spans several).
_MESSAGE_LINES = 8


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


def _said(*parts: str | None) -> str:
    """A Failure's message: its parts, and no more than a replica's status
    entry holds (kubelet's words in it are cut short already)."""
    return ": ".join(part for part in parts if part)[:REPLICA_MESSAGE_CHARS]


def last_line(text: str | None) -> str | None:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:_LINE_CHARS] if lines else None


def _plain(line: str) -> tuple[str, str]:
    """The line without vLLM's prefixes, and where it came from: its process
    and log record's source ("(EngineCore pid=9) [core.py:866]"), "" for a
    line printed as is (a traceback to stderr)."""
    line = _COLOR.sub("", line).strip()
    process = _PROCESS.match(line)
    rest = line[process.end() :] if process else line
    record = _RECORD.match(rest)
    source = (process.group(0).strip() if process else "") + (record.group(1) if record else "")
    return (rest[record.end() :] if record else rest).strip(), source


def last_words(log: str | None) -> str | None:
    """What a crashed run's log (or kubelet's tail of it) says of why it
    ended: the last exception that is not one of vLLM's wrappers, with its
    message's lines; else the last exception; else the last line. Lines are
    kept without vLLM's prefixes. A fix is read from these words only: every
    start logs its arguments (max_model_len among them)."""
    said = [plain for line in (log or "").splitlines() if (plain := _plain(line))[0]]
    lines = [line for line, _ in said]
    raised = [i for i, line in enumerate(lines) if _RAISED.match(line)]
    causes = [i for i in raised if not _WRAPPER.search(lines[i])] or raised
    if not causes:
        return lines[-1] if lines else None
    start = causes[-1]
    words = [lines[start]]
    for line, source in said[start + 1 : start + _MESSAGE_LINES]:
        # A message's lines come from where its first did: another process's
        # or log record's line is the next thing the log says.
        if source != said[start][1] or _RAISED.match(line) or _MESSAGE_END.match(line):
            break
        words.append(line)
    return "\n".join(words)


def hint(text: str | None) -> str | None:
    for pattern, fix in _HINTS:
        if text and pattern.search(text):
            return fix
    return None


def _not_started(container: ContainerFacts) -> bool:
    """Its last run never started: the runtime could not start its process."""
    return container.exit_code == _NOT_STARTED_CODE and container.exit_reason is ExitReason.OTHER


def termination(container: ContainerFacts) -> str | None:
    """'exit code 1 (Error)', 'OOMKilled (exit code 137)', 'not started (exit
    code 128)', or None if it never ended."""
    if container.exit_reason is ExitReason.OOM_KILLED:
        code = f" (exit code {container.exit_code})" if container.exit_code is not None else ""
        return f"OOMKilled{code}"
    if container.exit_code is None:
        return None
    if _not_started(container):
        return f"not started (exit code {container.exit_code})"
    # Other is shoal's word for a reason it does not know, not kubelet's.
    known = container.exit_reason not in (None, ExitReason.OTHER)
    return f"exit code {container.exit_code}" + (f" ({container.exit_reason})" if known else "")


@dataclass(frozen=True)
class CrashedRun:
    """A container's run that ended in failure, whose log the API serves:
    the container's own while it lies terminated, else (`previous`) the one
    before, once kubelet waits to start it again or has."""

    pod: str
    uid: str  # the pod's: a replaced pod (same name) is another run
    container: str
    restarts: int  # kubelet's restartCount: each crash is a new run
    previous: bool = True


def _reads_log(pod: PodFacts, container: ContainerFacts) -> bool:
    """Its failure quotes its last words (_crash)."""
    oom = container.exit_reason is ExitReason.OOM_KILLED  # the message needs no words
    return _failing(pod, container) and not oom and not _not_started(container)


def _run(pod: PodFacts, container: ContainerFacts) -> CrashedRun:
    # Terminated, not yet waiting or running again: a real kubelet leaves
    # the first crash so until its next sync, the run its own log.
    again = container.running or container.waiting is not None
    return CrashedRun(pod.name, pod.uid, container.name, container.restarts, previous=again)


def crashed_runs(observed: Observed) -> list[CrashedRun]:
    """The runs whose logs say why their replicas' engines crash."""
    return [
        _run(pod, container)
        for replica in observed.replicas.values()
        for pod in replica.members
        for container in pod.containers
        if _reads_log(pod, container)
    ]


def with_last_words(observed: Observed, words: Mapping[CrashedRun, str | None]) -> Observed:
    """The facts with what each crashed run's log said (last_words; None:
    it could not be read) in place of its termination message, kubelet's
    last 2 KB of the same log: vLLM's cause comes before the API server's
    traceback of ~4.5 KB, and falls out of it."""
    if not any(words.values()):
        return observed

    def read(pod: PodFacts, container: ContainerFacts) -> ContainerFacts:
        said = words.get(_run(pod, container))
        return replace(container, exit_message=said) if said else container

    return replace(
        observed,
        replicas={
            index: replace(
                replica,
                pods=[
                    replace(pod, containers=tuple(read(pod, c) for c in pod.containers))
                    for pod in replica.pods
                ],
            )
            for index, replica in observed.replicas.items()
        },
    )


def _failing(pod: PodFacts, container: ContainerFacts) -> bool:
    return container.crashed and not pod.ready


def _crash(pod: PodFacts, container: ContainerFacts) -> Failure:
    restarts = f"{container.restarts} restart{'s' if container.restarts != 1 else ''}"
    logs = f"see kubectl logs {pod.name} --previous"
    if container.exit_reason is ExitReason.OOM_KILLED:
        return Failure(
            ReplicaState.CRASH_LOOPING,
            ConditionReason.ENGINE_OOM_KILLED,
            _said(
                f"the engine of pod {pod.name} was OOMKilled ({restarts})",
                "raise spec.engine.resources.limits.memory (vLLM stages weights in host memory)",
                logs,
            ),
        )
    words = last_words(container.exit_message)
    exited = (
        f"exits with code {container.exit_code}"
        if container.exit_code is not None
        else "keeps exiting"
    )
    return Failure(
        ReplicaState.CRASH_LOOPING,
        ConditionReason.ENGINE_CRASH_LOOPING,
        _said(
            f"the engine of pod {pod.name} {exited} ({restarts})",
            f'saying "{words.splitlines()[0][:_LINE_CHARS]}"' if words else None,
            hint(words),
            logs,
        ),
    )


def _cannot_run(pod: PodFacts, container: ContainerFacts) -> Failure:
    """The runtime cannot start it. kubelet's waiting reason alternates
    (RunContainerError, then CrashLoopBackOff while it backs off), so its last
    run is told when it has one: one reason and one message throughout."""
    if _not_started(container):
        how, words = f"exit code {container.exit_code}", last_line(container.exit_message)
    else:
        how, words = str(container.waiting), last_line(container.waiting_message)
    return Failure(
        ReplicaState.CRASH_LOOPING,
        ConditionReason.CONTAINER_CANNOT_RUN,
        _said(
            f"pod {pod.name} cannot run its engine ({how})",
            f'"{words}"' if words else None,
            _CANNOT_RUN_FIX,
        ),
    )


def container_failure(pod: PodFacts, container: ContainerFacts) -> Failure | None:
    waiting = container.waiting
    if waiting in _PULL:
        return Failure(
            ReplicaState.IMAGE_PULL_FAILING,
            ConditionReason.IMAGE_PULL_FAILING,
            _said(
                f"image {container.image[:_LINE_CHARS]} cannot be pulled ({waiting}) for pod "
                f"{pod.name}",
                "check spec.image and the registry's credentials (imagePullSecrets)",
            ),
        )
    if waiting is Waiting.CONFIG_ERROR:
        said = last_line(container.waiting_message) or "a Secret or ConfigMap it needs is missing"
        return Failure(
            ReplicaState.MISCONFIGURED,
            ConditionReason.CONTAINER_CONFIG_ERROR,
            _said(
                f"pod {pod.name} cannot start",
                said,
                "create it, or fix the reference (e.g. spec.model.source.hf.tokenSecret)",
            ),
        )
    if waiting in _CANNOT_RUN or (_not_started(container) and _failing(pod, container)):
        return _cannot_run(pod, container)
    if _failing(pod, container):
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
