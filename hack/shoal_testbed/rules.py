"""Which local process plays a pod's container.

A rule maps a pod to a Launch, or to None when it does not apply; the pod runner
uses the first rule that applies and leaves other pods alone (kwok still marks
them Running). Rules: pods annotated `testbed.shoal.dev/run`, vLLM engine pods (the
simulator), and pods of the shoal image (routers, helm test pods).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shoal_testbed.podfs import Mount, config_mounts, host_volume_mounts
from shoal_testbed.podspec import Pod, command_line, container, container_env

RUN_ANNOTATION = "testbed.shoal.dev/run"


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    # The container this process plays (its status is the one reported).
    container: str = ""
    image: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # Run with a kubeconfig holding a token of this ServiceAccount (the pod's).
    service_account: str | None = None
    # ConfigMap and Secret volumes to write out, paths in argv moved to them.
    mounts: tuple[Mount, ...] = ()


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
    return Launch(
        argv=command_line(spec, env), env=env, container=name, image=str(spec.get("image", ""))
    )


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
        if args and _on_host_volume(args[0], pod, spec):
            # A model on a volume is loaded from its files, as vLLM would.
            argv.append("--sim-load-model")
        elif (home := env.get("HF_HOME")) and _on_host_volume(home, pod, spec):
            # A Hub model with its cache on the node: fetched into it, then loaded.
            argv += ["--sim-load-model", f"--sim-hf-home={home}"]
        return Launch(argv=argv, env=env, container=spec["name"], image=str(spec["image"]))
    return None


def _on_host_volume(path: str, pod: Pod, spec: dict[str, object]) -> bool:
    return any(
        path == base or path.startswith(base.rstrip("/") + "/")
        for base, _ in host_volume_mounts(pod, dict(spec))
    )


def is_shoal_image(image: str) -> bool:
    """`shoal`, `shoal:0.1.0`, `ghcr.io/org/shoal@sha256:...`: the repository is shoal."""
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    return last.split(":", 1)[0] == "shoal"


def bind_to_pod_ip(args: list[str], pod_ip: str) -> list[str]:
    """A real pod binds 0.0.0.0 inside its own network namespace; here every
    pod shares the host's, so `--host` and any 0.0.0.0 address (e.g. the
    operator's `--liveness=http://0.0.0.0:8080/healthz`) move to the pod's IP."""
    bound = []
    expect_value = False
    for arg in (a.replace("0.0.0.0", pod_ip) for a in args):
        if expect_value:
            bound.append(pod_ip)
            expect_value = False
        elif arg == "--host":
            bound.append(arg)
            expect_value = True
        elif arg.startswith("--host="):
            bound.append(f"--host={pod_ip}")
        else:
            bound.append(arg)
    return bound


def shoal_pod(pod: Pod) -> Launch | None:
    """A container of the shoal image runs `python -m shoal.cli <its args>`
    (the image's entrypoint is `shoal`) as the pod's ServiceAccount, with its
    ConfigMap and Secret volumes, listening on the pod IP."""
    for spec in pod.get("spec", {}).get("containers", []):
        if not is_shoal_image(str(spec.get("image", ""))):
            continue
        env = container_env(pod, spec)
        command = command_line({"command": spec.get("command", [])}, env)
        args = command_line({"args": spec.get("args", [])}, env)
        if command[:1] == ["shoal"]:
            args = command[1:] + args
        elif command:
            return None  # some other program in the image
        pod_ip = str(pod.get("status", {}).get("podIP", ""))
        return Launch(
            argv=[sys.executable, "-m", "shoal.cli", *bind_to_pod_ip(args, pod_ip)],
            env=env,
            container=spec["name"],
            image=str(spec["image"]),
            service_account=pod.get("spec", {}).get("serviceAccountName") or "default",
            mounts=config_mounts(pod, spec),
        )
    return None


DEFAULT_RULES: Sequence[Rule] = (annotated_container, vllm_engine, shoal_pod)
