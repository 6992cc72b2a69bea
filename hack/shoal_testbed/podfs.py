"""What kubelet gives a container besides its process, for pods the pod runner
plays: the pod's ServiceAccount credentials (as a kubeconfig holding a token
from the TokenRequest API, bound to the pod, so RBAC applies for real) and
ConfigMap and Secret volumes (as files under a per-pod directory, with paths
in the command line moved there), kept up to date while the pod runs.

Volumes are laid out as kubelet's atomic writer does: the files in a
timestamped `..<time>` directory, `..data` a symlink to it, and each top-level
name a symlink through `..data`; an update writes a new directory and swaps
`..data` in one rename, so a reader sees the old set or the new one, never a
mix, and a file's inode changes when it does.

`prepare`, `refresh` and `referenced_env` (env from ConfigMap and Secret
keys) do the API I/O; `write_volume` the file I/O; the rest is pure."""

from __future__ import annotations

import base64
import datetime
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from shoal_testbed.podspec import Pod, env_references

TOKEN_SECONDS = 24 * 3600
# Variables that would make a client try in-cluster config (and some other
# credentials) before KUBECONFIG.
_IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


@dataclass(frozen=True)
class Mount:
    """A ConfigMap or Secret volume mounted into the container."""

    path: str  # mountPath in the container
    kind: str  # configMap or secret
    name: str  # the ConfigMap's or Secret's name
    items: tuple[tuple[str, str], ...] = ()  # (key, path) when the volume lists items


def config_mounts(pod: Pod, container: dict[str, Any]) -> tuple[Mount, ...]:
    volumes = {v.get("name"): v for v in pod.get("spec", {}).get("volumes", [])}
    mounts = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount.get("name"), {})
        for kind, name_key in (("configMap", "name"), ("secret", "secretName")):
            source = volume.get(kind)
            if source is None:
                continue
            items = tuple((i["key"], i["path"]) for i in source.get("items", []))
            mounts.append(
                Mount(path=mount["mountPath"], kind=kind, name=source[name_key], items=items)
            )
    return tuple(mounts)


def relocate(argv: list[str], mounts: tuple[Mount, ...], root: Path) -> list[str]:
    """Arguments naming a path under a mount (`/etc/x/f`, `--config=/etc/x/f`)
    name the same file under root instead."""
    moved = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        target = value if eq else arg
        for mount in mounts:
            base = mount.path.rstrip("/")
            if target == base or target.startswith(base + "/"):
                target = str(root) + target
                break
        moved.append(f"{flag}={target}" if eq else target)
    return moved


def service_account_kubeconfig(
    *, server: str, ca_file: str | None, token: str, namespace: str
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": cluster}],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [
            {
                "name": "pod",
                "context": {"cluster": "testbed", "user": "pod", "namespace": namespace},
            }
        ],
        "current-context": "pod",
    }


def _object_data(
    api: client.CoreV1Api, namespace: str, *, kind: str, name: str
) -> dict[str, bytes]:
    if kind == "configMap":
        config_map = api.read_namespaced_config_map(name, namespace)
        return {k: v.encode() for k, v in (config_map.data or {}).items()}
    secret = api.read_namespaced_secret(name, namespace)
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _files(api: client.CoreV1Api, namespace: str, mount: Mount) -> dict[str, bytes]:
    data = _object_data(api, namespace, kind=mount.kind, name=mount.name)
    if mount.items:
        return {path: data[key] for key, path in mount.items if key in data}
    return data


def _token(api: client.CoreV1Api, pod: Pod, service_account: str) -> str:
    meta = pod["metadata"]
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=TOKEN_SECONDS,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
            ),
        )
    )
    response = api.create_namespaced_service_account_token(
        service_account, meta["namespace"], request
    )
    if response.status is None:
        raise client.ApiException(reason=f"no token for ServiceAccount {service_account}")
    return str(response.status.token)


def _read_tree(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in directory.rglob("*")
        if path.is_file()
    }


def write_volume(directory: Path, files: dict[str, bytes]) -> bool:
    """Make `directory` hold exactly `files` (relative path -> content), in
    kubelet's atomic-writer layout. False when it already did."""
    data = directory / "..data"
    if data.is_dir() and _read_tree(data) == files:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    fresh = directory / stamp
    for relative, content in files.items():
        path = fresh / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    old = directory / data.readlink() if data.is_symlink() else None
    swap = directory / "..data_tmp"
    swap.unlink(missing_ok=True)
    swap.symlink_to(stamp)
    swap.replace(data)  # the one atomic step
    tops = {Path(relative).parts[0] for relative in files}
    for top in tops:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(Path("..data") / top)
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in tops:
            entry.unlink()
    if old is not None and old != fresh:
        shutil.rmtree(old, ignore_errors=True)
    return True


def refresh(api: client.CoreV1Api, pod: Pod, mounts: tuple[Mount, ...], root: Path) -> list[str]:
    """Bring the pod's volumes up to date with their ConfigMaps and Secrets,
    as kubelet's periodic sync does; the mount paths that changed."""
    namespace = pod["metadata"]["namespace"]
    changed = []
    for mount in mounts:
        directory = root / mount.path.lstrip("/")
        if write_volume(directory, _files(api, namespace, mount)):
            changed.append(mount.path)
    return changed


def prepare(
    api: client.CoreV1Api,
    pod: Pod,
    *,
    argv: list[str],
    service_account: str | None,
    mounts: tuple[Mount, ...],
    root: Path,
) -> tuple[list[str], dict[str, str], tuple[str, ...]]:
    """(argv, env to add, env names to drop) for a pod's process, after writing
    its files under root."""
    namespace = pod["metadata"]["namespace"]
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    refresh(api, pod, mounts, root)
    env: dict[str, str] = {}
    dropped: tuple[str, ...] = ()
    if service_account is not None:
        configuration = api.api_client.configuration
        kubeconfig = service_account_kubeconfig(
            server=configuration.host,
            ca_file=configuration.ssl_ca_cert,
            token=_token(api, pod, service_account),
            namespace=namespace,
        )
        path = root / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        path.chmod(0o600)
        env["KUBECONFIG"] = str(path)
        dropped = _IN_CLUSTER_ENV
    return relocate(argv, mounts, root), env, dropped


@dataclass(frozen=True)
class HostMount:
    """A hostPath volume, or a claim bound to a hostPath or local
    PersistentVolume: a directory of this machine, shared as kubelet's bind
    mounts are (a restarted pod finds its files there). A hostPath is its
    node's: a subdirectory per node, as each kwok node stands for a machine."""

    path: str  # mountPath in the container
    host: str  # the directory on this machine


def host_volume_mounts(pod: Pod, container: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(mountPath, volume) of the container's hostPath and claim volumes."""
    volumes = {v.get("name"): v for v in pod.get("spec", {}).get("volumes", [])}
    found = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount.get("name"), {})
        if "hostPath" in volume or "persistentVolumeClaim" in volume:
            found.append((str(mount["mountPath"]), {**volume, "subPath": mount.get("subPath", "")}))
    return found


def host_mounts(
    api: client.CoreV1Api, pod: Pod, container: dict[str, Any]
) -> tuple[HostMount, ...]:
    """The container's host directories; a claim not bound to a hostPath or
    local volume is left out (nothing here could hold its files)."""
    namespace = pod["metadata"]["namespace"]
    mounts = []
    for path, volume in host_volume_mounts(pod, container):
        host: str | None = None
        if "hostPath" in volume:
            node = str(pod.get("spec", {}).get("nodeName") or "")
            host = str(Path(volume["hostPath"]["path"]) / node)
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                Path(host).mkdir(parents=True, exist_ok=True)
        else:
            claim = api.read_namespaced_persistent_volume_claim(
                volume["persistentVolumeClaim"]["claimName"], namespace
            )
            volume_name = claim.spec.volume_name if claim.spec is not None else None
            if volume_name:
                bound = api.read_persistent_volume(volume_name).spec
                source = (bound.host_path or bound.local) if bound is not None else None
                host = source.path if source is not None else None
        if host is not None:
            mounts.append(HostMount(path=path, host=str(Path(host) / volume["subPath"])))
    return tuple(mounts)


def relocate_to_host(argv: list[str], mounts: tuple[HostMount, ...]) -> list[str]:
    """Arguments naming a path under a host mount name it on this machine."""
    moved = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        target = value if eq else arg
        for mount in mounts:
            base = mount.path.rstrip("/")
            if target == base or target.startswith(base + "/"):
                target = mount.host.rstrip("/") + target[len(base) :]
                break
        moved.append(f"{flag}={target}" if eq else target)
    return moved


class ConfigError(Exception):
    """What kubelet reports as CreateContainerConfigError."""


_KIND_NAMES = {"configMap": "ConfigMap", "secret": "Secret"}


def referenced_env(api: client.CoreV1Api, pod: Pod, container: dict[str, Any]) -> dict[str, str]:
    """The env a container takes from ConfigMaps and Secrets; ConfigError, in
    kubelet's words, when one it needs is missing."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for name, kind, source, key, optional in env_references(container):
        try:
            values = _object_data(api, namespace, kind=kind, name=source)
        except client.ApiException as error:
            if error.status != 404:
                raise
            if optional:
                continue
            raise ConfigError(f'{kind.lower()} "{source}" not found') from error
        if key is None:
            env.update({k: v.decode(errors="replace") for k, v in values.items()})
        elif key in values:
            env[name] = values[key].decode(errors="replace")
        elif not optional:
            raise ConfigError(
                f"couldn't find key {key} in {_KIND_NAMES[kind]} {namespace}/{source}"
            )
    return env
