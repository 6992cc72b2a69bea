"""A pod template with the user's pod settings (`spec.engine.pod`,
`spec.router.pod`) added to what a builder made. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shoal.api.pods import PodSettings, RouterPodSettings


def pull_secret_entries(names: Iterable[str]) -> list[dict[str, str]]:
    """imagePullSecrets entries, each name once (the API server warns of a repeat)."""
    return [{"name": name} for name in dict.fromkeys(names)]


def with_pod_settings(template: dict[str, Any], settings: PodSettings | None) -> dict[str, Any]:
    """The template with settings added; its first container is the main one. shoal's
    own labels and annotations win, so selectors and hashes stay shoal's."""
    if settings is None:
        return template
    metadata = dict(template.get("metadata", {}))
    for key, extra in (("labels", settings.labels), ("annotations", settings.annotations)):
        if extra:
            metadata[key] = {**extra, **metadata.get(key, {})}
    pod = dict(template["spec"])
    main, *sidecars = pod["containers"]
    container = dict(main)
    if settings.service_account_name is not None:
        pod["serviceAccountName"] = settings.service_account_name
    if settings.image_pull_secrets:
        present = [entry["name"] for entry in pod.get("imagePullSecrets", [])]
        given = [secret.name for secret in settings.image_pull_secrets]
        pod["imagePullSecrets"] = pull_secret_entries([*present, *given])
    if settings.priority_class_name is not None:
        pod["priorityClassName"] = settings.priority_class_name
    if settings.runtime_class_name is not None:
        pod["runtimeClassName"] = settings.runtime_class_name
    if settings.security_context is not None:
        pod["securityContext"] = dict(settings.security_context)
    if settings.volumes:
        pod["volumes"] = [*pod.get("volumes", []), *settings.volumes]
    if settings.volume_mounts:
        container["volumeMounts"] = [*container.get("volumeMounts", []), *settings.volume_mounts]
    if settings.env_from:
        container["envFrom"] = list(settings.env_from)
    if settings.container_security_context is not None:
        container["securityContext"] = dict(settings.container_security_context)
    if isinstance(settings, RouterPodSettings):
        if settings.node_selector:
            pod["nodeSelector"] = dict(settings.node_selector)
        if settings.tolerations:
            pod["tolerations"] = list(settings.tolerations)
        if settings.affinity is not None:
            pod["affinity"] = settings.affinity.manifest()
    pod["containers"] = [container, *sidecars]
    return {**template, "metadata": metadata, "spec": pod}
