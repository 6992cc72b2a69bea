"""Which local process plays a pod's container.

A rule maps a pod to a Launch, or to None when it does not apply; the pod runner
uses the first rule that applies and leaves other pods alone (kwok still marks
them Running). Later issues add rules for vLLM engine pods and shoal-image pods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shoal_testbed.podspec import Pod, command_line, container, container_env

RUN_ANNOTATION = "testbed.shoal.dev/run"


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


Rule = Callable[[Pod], Launch | None]


def annotated_container(pod: Pod) -> Launch | None:
    """Run the container named by the pod's `testbed.shoal.dev/run` annotation
    with its own command and args, as written in the pod."""
    name = pod.get("metadata", {}).get("annotations", {}).get(RUN_ANNOTATION)
    if not name:
        return None
    spec = container(pod, name)
    if spec is None or not (spec.get("command") or spec.get("args")):
        return None
    env = container_env(pod, spec)
    return Launch(argv=command_line(spec, env), env=env)


DEFAULT_RULES: Sequence[Rule] = (annotated_container,)
