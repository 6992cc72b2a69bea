"""Which local process plays a pod's container.

A rule maps a pod to a Launch, or to None when it does not apply; the pod runner
uses the first rule that applies and leaves other pods alone (kwok still marks
them Running). Later issues add rules for vLLM engine pods and shoal-image pods.
"""

from __future__ import annotations

import sys
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


# How vLLM images start the server: `vllm serve MODEL ...` (the image's
# entrypoint) or `python3 -m vllm.entrypoints.openai.api_server ...`.
_VLLM_ENTRYPOINTS = (
    ["vllm", "serve"],
    ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    ["python", "-m", "vllm.entrypoints.openai.api_server"],
)


def vllm_engine(pod: Pod) -> Launch | None:
    """A container of a vLLM image runs `shoal sim` with the pod's own vLLM
    arguments, bound to the pod IP (a real engine binds 0.0.0.0)."""
    for spec in pod.get("spec", {}).get("containers", []):
        if "vllm" not in str(spec.get("image", "")):
            continue
        env = container_env(pod, spec)
        command = command_line({"command": spec.get("command", [])}, env)
        args = command_line({"args": spec.get("args", [])}, env)
        for entry in _VLLM_ENTRYPOINTS:
            if command[: len(entry)] == entry:
                args = command[len(entry) :] + args
                break
        else:
            if command:
                return None  # some other program in a vLLM image: not ours to fake
        pod_ip = str(pod.get("status", {}).get("podIP", ""))
        argv = [sys.executable, "-m", "shoal.cli", "sim", *args, "--host", pod_ip]
        return Launch(argv=argv, env=env)
    return None


DEFAULT_RULES: Sequence[Rule] = (annotated_container, vllm_engine)
