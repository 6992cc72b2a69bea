"""A container's life as kubelet reports it, for the containers the pod runner
plays. Pure: the runner feeds it what happened (started, exited, could not
pull, could not configure) and the clock; it answers when to try again and
the containerStatuses entry kubelet would write.

What it pins, after kubelet:
- restarts back off 10 s, doubling to 5 min, reset once a container ran for
  10 min; while it waits the container is `waiting: CrashLoopBackOff` with
  the last exit in `lastState.terminated` (exit code, reason `Completed`,
  `Error` or `OOMKilled`, and with `terminationMessagePolicy:
  FallbackToLogsOnError` the tail of its log as the message); `restartCount`
  counts the restarts made;
- an image that cannot be pulled (the testbed's convention: its name or tag
  contains `doesnotexist`) is `waiting: ErrImagePull` right after an attempt
  and `ImagePullBackOff` until the next, on the same backoff;
- a container whose env names a missing Secret, ConfigMap or key is
  `waiting: CreateContainerConfigError`, and starts once they exist.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0
# kubelet forgets a container's backoff after it ran this long.
BACKOFF_RESET_SECONDS = 600.0
# How long ErrImagePull shows after a failed pull before ImagePullBackOff.
PULL_ERROR_SHOWN_SECONDS = 2.0
# kubelet's limits for a termination message taken from the log.
LOG_MESSAGE_LINES = 80
LOG_MESSAGE_BYTES = 2048
# The testbed's unpullable images: `vllm/vllm-openai:doesnotexist`, `doesnotexist/x`.
UNPULLABLE_MARKER = "doesnotexist"


class Waiting(StrEnum):
    """Reasons of a waiting container, as kubelet spells them."""

    CREATING = "ContainerCreating"
    CRASH_LOOP = "CrashLoopBackOff"
    PULL_ERROR = "ErrImagePull"
    PULL_BACKOFF = "ImagePullBackOff"
    CONFIG_ERROR = "CreateContainerConfigError"


class Terminated(StrEnum):
    COMPLETED = "Completed"
    ERROR = "Error"
    OOM_KILLED = "OOMKilled"


def backoff_seconds(failures: int) -> float:
    """kubelet's delay before the next try after `failures` failures in a row."""
    if failures <= 0:
        return 0.0
    return min(BACKOFF_BASE_SECONDS * 2.0 ** (failures - 1), BACKOFF_MAX_SECONDS)


def go_duration(seconds: float) -> str:
    """Whole seconds as Go's time.Duration prints them (kubelet's messages)."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def unpullable(image: str) -> bool:
    return UNPULLABLE_MARKER in image


def pull_error_message(image: str) -> str:
    reference = image if "/" in image.split(":", 1)[0] else f"library/{image}"
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/'
        f'{reference}": failed to resolve reference "docker.io/{reference}": not found'
    )


def exit_code(returncode: int) -> int:
    """Popen's returncode (-N when killed by signal N) as a container's exit code."""
    return 128 - returncode if returncode < 0 else returncode


def termination_reason(returncode: int) -> Terminated:
    """A SIGKILL stands in for the kernel's OOM killer, the usual sender of one
    on a node (the runner never notices the exit of a process it stops)."""
    if returncode == -signal.SIGKILL:
        return Terminated.OOM_KILLED
    return Terminated.COMPLETED if returncode == 0 else Terminated.ERROR


def log_message(log: str) -> str:
    """FallbackToLogsOnError: the last lines of the log, within kubelet's limits."""
    lines = log.splitlines()[-LOG_MESSAGE_LINES:]
    tail = "\n".join(lines).encode()[-LOG_MESSAGE_BYTES:]
    return tail.decode(errors="replace")


@dataclass
class Container:
    """One container's state; times are (wall RFC 3339 text, monotonic seconds)."""

    name: str
    image: str
    pod: str = ""  # as kubelet names it in messages: name_namespace(uid)
    restart_count: int = 0
    failures: int = 0  # in a row, for the backoff
    retry_at: float = 0.0
    waiting: tuple[Waiting, str] | None = (Waiting.CREATING, "")
    waiting_since: float = 0.0
    running_since: tuple[str, float] | None = None
    terminated: dict[str, Any] | None = None  # final: the pod ran to completion
    last_terminated: dict[str, Any] | None = None
    ever_started: bool = False

    @property
    def finished(self) -> bool:
        return self.terminated is not None

    @property
    def next_run(self) -> int:
        """The restart count the next start will have (its run's number)."""
        return self.restart_count + 1 if self.ever_started else 0

    def due(self, now: float) -> bool:
        """Whether to try starting it now."""
        return not self.finished and self.running_since is None and now >= self.retry_at

    def started(self, *, wall: str, now: float) -> None:
        if self.ever_started:
            self.restart_count += 1
        self.ever_started = True
        self.waiting = None
        self.running_since = (wall, now)

    def exited(
        self,
        returncode: int,
        *,
        reason: Terminated,
        message: str,
        restart: bool,
        wall: str,
        now: float,
    ) -> None:
        started_wall, started_at = self.running_since or (wall, now)
        self.running_since = None
        record: dict[str, Any] = {
            "exitCode": exit_code(returncode),
            "reason": str(reason),
            "startedAt": started_wall,
            "finishedAt": wall,
        }
        if message:
            record["message"] = message
        if not restart:
            self.terminated = record
            return
        self.last_terminated = record
        if now - started_at >= BACKOFF_RESET_SECONDS:
            self.failures = 0
        self.failures += 1
        delay = backoff_seconds(self.failures)
        self.retry_at = now + delay
        self.waiting = (
            Waiting.CRASH_LOOP,
            f"back-off {go_duration(delay)} restarting failed container={self.name}"
            + (f" pod={self.pod}" if self.pod else ""),
        )
        self.waiting_since = now

    def pull_failed(self, *, now: float) -> None:
        self.failures += 1
        self.retry_at = now + backoff_seconds(self.failures)
        self.waiting = (Waiting.PULL_ERROR, pull_error_message(self.image))
        self.waiting_since = now

    def config_failed(self, message: str, *, now: float, retry_seconds: float) -> None:
        self.retry_at = now + retry_seconds
        self.waiting = (Waiting.CONFIG_ERROR, message)
        self.waiting_since = now

    def status(self, *, now: float) -> dict[str, Any]:
        """The containerStatuses entry kubelet would write now."""
        state: dict[str, Any]
        if self.terminated is not None:
            state = {"terminated": self.terminated}
        elif self.running_since is not None:
            state = {"running": {"startedAt": self.running_since[0]}}
        else:
            reason, message = self.waiting or (Waiting.CREATING, "")
            if (
                reason is Waiting.PULL_ERROR
                and now - self.waiting_since >= PULL_ERROR_SHOWN_SECONDS
            ):
                reason, message = Waiting.PULL_BACKOFF, f'Back-off pulling image "{self.image}"'
            state = {
                "waiting": {"reason": str(reason), **({"message": message} if message else {})}
            }
        entry: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.running_since is not None,
            "started": self.running_since is not None,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        return entry
