"""kopf's credentials, found where shoal's own API client (kr8s, `shoal.apiserver`)
finds them, so the operator's watches and its writes act as one identity:

- a kubeconfig, if one is found ($KUBECONFIG, else ~/.kube/config): kopf's
  `login_with_kubeconfig` reads it;
- else, in a pod, what client-go's `rest.InClusterConfig` reads: the API
  server at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (an IPv6 host in
  brackets) and the ServiceAccount's token, CA and namespace files.

Not `kopf.login_via_client`: it needs the `kubernetes` package, which the image
does not install (the operator's container could not log in). Not kopf's
`login_with_service_account` either: it dials https://kubernetes.default.svc,
which needs cluster DNS; the Service's address is in the pod's environment.

Bound ServiceAccount tokens rotate: kubelet writes a new one into the file
well before the old one goes stale. The credentials expire when the token
read goes stale (its `kubernetes.io.warnafter` claim, which the API server
adds when it extends a token's life, else its `exp`), and kopf then logs in
again and reads the file anew; a 401 makes kopf log in again too."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def api_server_url(env: Mapping[str, str]) -> str | None:
    """The API server as a pod sees it, from the variables kubelet sets for
    the `kubernetes` Service; None outside a pod (either variable missing)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    # net.JoinHostPort's rule: a host with a colon is an IPv6 address.
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def token_stale_at(token: str) -> datetime.datetime | None:
    """When the token read from the file should be read again: its
    `kubernetes.io.warnafter` claim, else its `exp`; None for a token that is
    not a JWT or carries neither (it is then read again on a 401 only). The
    claims are read, not verified: the API server verifies them."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(claims, dict):
        return None
    extended = claims.get("kubernetes.io")
    warn_after = extended.get("warnafter") if isinstance(extended, dict) else None
    for moment in (warn_after, claims.get("exp")):
        if isinstance(moment, int | float) and not isinstance(moment, bool):
            return datetime.datetime.fromtimestamp(moment, tz=datetime.UTC)
    return None


def in_cluster_credentials(
    env: Mapping[str, str],
    *,
    token: str,
    namespace: str | None,
    ca_path: str | None,
    trust_env: bool = False,
) -> kopf.ConnectionInfo | None:
    """The pod's ServiceAccount as kopf's credentials; None outside a pod."""
    server = api_server_url(env)
    token = token.strip()
    if server is None or not token:
        return None
    return kopf.ConnectionInfo(
        server=server,
        ca_path=ca_path,
        token=token,
        default_namespace=(namespace or "").strip() or None,
        trust_env=trust_env,
        expiration=token_stale_at(token),
    )


def kubeconfig_found(env: Mapping[str, str], *, home: Path) -> bool:
    """Whether a kubeconfig is there, as kr8s looks for one: the files of
    $KUBECONFIG (colon separated), else ~/.kube/config."""
    listed = env.get("KUBECONFIG")
    paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p] if listed else []
    return any(path.is_file() for path in paths or [home / ".kube" / "config"])


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def credentials(
    *,
    env: Mapping[str, str],
    home: Path,
    service_account_dir: Path,
    settings: kopf.OperatorSettings,
) -> kopf.ConnectionInfo:
    """A kubeconfig's credentials if one is found, else the ServiceAccount's
    in service_account_dir; PermanentError when neither is there. (kopf's
    kubeconfig reader looks for the file as kubeconfig_found does, in the
    process's own environment.)"""
    trust_env = settings.networking.trust_env
    if kubeconfig_found(env, home=home):
        info = kopf.login_with_kubeconfig(settings=settings)
        if info is not None:
            return info
    ca_file = service_account_dir / "ca.crt"
    info = in_cluster_credentials(
        env,
        token=_read(service_account_dir / "token") or "",
        namespace=_read(service_account_dir / "namespace"),
        ca_path=str(ca_file) if ca_file.is_file() else None,
        trust_env=trust_env,
    )
    if info is None:
        raise kopf.PermanentError(
            "no Kubernetes credentials: no kubeconfig ($KUBECONFIG, ~/.kube/config), and "
            f"not in a pod ($KUBERNETES_SERVICE_HOST/PORT and {service_account_dir}/token)"
        )
    return info


def login(*, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> kopf.ConnectionInfo:
    """kopf's login handler: a kubeconfig, else the pod's ServiceAccount."""
    info = credentials(
        env=os.environ,
        home=Path.home(),
        service_account_dir=SERVICE_ACCOUNT_DIR,
        settings=settings,
    )
    logger.debug("Logged in to %s.", info.server)
    return info
