"""Pure helpers that read a pod as kubelet would: its environment and the
$(VAR) expansion of command and args."""

from __future__ import annotations

import re
from typing import Any

Pod = dict[str, Any]

_FIELD_PATHS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "metadata.uid": ("metadata", "uid"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "status.podIP": ("status", "podIP"),
    "status.hostIP": ("status", "hostIP"),
}
_LABEL_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def container(pod: Pod, name: str) -> dict[str, Any] | None:
    for spec in pod.get("spec", {}).get("containers", []):
        if spec.get("name") == name:
            return dict(spec)
    return None


def field_value(pod: Pod, path: str) -> str:
    if path in _FIELD_PATHS:
        section, key = _FIELD_PATHS[path]
        return str(pod.get(section, {}).get(key, "") or "")
    if match := _LABEL_PATH.fullmatch(path):
        return str(pod.get("metadata", {}).get(match.group(1), {}).get(match.group(2), ""))
    raise ValueError(f"unsupported fieldRef {path!r}")


def container_env(pod: Pod, spec: dict[str, Any]) -> dict[str, str]:
    """The container's env: literal values (themselves $(VAR)-expanded against
    the earlier entries, as kubelet does) and downward-API fieldRefs. Secret and
    ConfigMap references are not resolved here."""
    env: dict[str, str] = {}
    for item in spec.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
        elif ref := item.get("valueFrom", {}).get("fieldRef"):
            env[name] = field_value(pod, ref["fieldPath"])
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: unknown references stay as written, $$ is a $."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(substitute, text)


def command_line(spec: dict[str, Any], env: dict[str, str]) -> list[str]:
    argv = [*spec.get("command", []), *spec.get("args", [])]
    return [expand(str(part), env) for part in argv]


def env_references(spec: dict[str, Any]) -> list[tuple[str, str, str, str | None, bool]]:
    """(env name or "", kind configMap|secret, object name, key or None for
    envFrom, optional) for every env entry and envFrom source that names a
    ConfigMap or Secret, in the container's order."""
    found: list[tuple[str, str, str, str | None, bool]] = []
    for item in spec.get("env", []):
        source = item.get("valueFrom") or {}
        for kind, field in (("configMap", "configMapKeyRef"), ("secret", "secretKeyRef")):
            ref = source.get(field)
            if ref is not None:
                found.append(
                    (item["name"], kind, ref["name"], ref["key"], bool(ref.get("optional")))
                )
    for item in spec.get("envFrom", []):
        for kind, field in (("configMap", "configMapRef"), ("secret", "secretRef")):
            ref = item.get(field)
            if ref is not None:
                found.append(("", kind, ref["name"], None, bool(ref.get("optional"))))
    return found
