"""The operator's login (controller/login.py), on plain data and files:

- in a pod, the API server is the `kubernetes` Service's address from the
  environment (an IPv6 host in brackets), never kubernetes.default.svc;
- the ServiceAccount's token, CA and namespace files are the credentials;
- a bound token's credentials expire when the token goes stale (warnafter,
  else exp), so kopf reads the rotated file again;
- a kubeconfig, when there is one, wins (as it does for kr8s);
- the operator logs in from its pod without the `kubernetes` package.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from shoal.controller import login

IN_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


def service_account(directory: Path, *, token: str, namespace: str = "shoal-system") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (directory / "namespace").write_text(namespace)
    return directory


def test_in_a_pod_the_api_server_is_the_kubernetes_service_address_from_the_environment() -> None:
    assert login.api_server_url(IN_POD) == "https://10.96.0.1:443"
    ipv6 = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert login.api_server_url(ipv6) == "https://[fd00:10:96::1]:6443"


def test_outside_a_pod_there_is_no_in_cluster_api_server() -> None:
    assert login.api_server_url({}) is None
    assert login.api_server_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None
    assert login.in_cluster_credentials({}, token="t", namespace=None, ca_path=None) is None


def test_a_bound_token_goes_stale_at_its_warnafter_else_at_its_exp() -> None:
    extended = jwt({"exp": 2_000_000_000, "kubernetes.io": {"warnafter": 1_800_000_000}})
    assert login.token_stale_at(extended) == datetime.datetime.fromtimestamp(
        1_800_000_000, tz=datetime.UTC
    )
    short = jwt({"exp": 1_700_000_000, "kubernetes.io": {"namespace": "x"}})
    assert login.token_stale_at(short) == datetime.datetime.fromtimestamp(
        1_700_000_000, tz=datetime.UTC
    )


def test_a_token_that_is_not_a_jwt_never_expires_by_itself() -> None:
    assert login.token_stale_at("opaque-token") is None
    assert login.token_stale_at("a.!!!.c") is None
    assert login.token_stale_at(jwt({"sub": "system:serviceaccount:x:y"})) is None


def test_the_service_accounts_files_are_kopfs_credentials_until_the_token_goes_stale() -> None:
    token = jwt({"exp": 1_900_000_000})
    info = login.in_cluster_credentials(
        IN_POD, token=token + "\n", namespace="shoal-system\n", ca_path="/sa/ca.crt"
    )
    assert info is not None
    assert info.server == "https://10.96.0.1:443"
    assert info.as_http_headers() == {"Authorization": f"Bearer {token}"}
    assert info.ca_path == "/sa/ca.crt"
    assert info.default_namespace == "shoal-system"
    assert info.expiration == datetime.datetime.fromtimestamp(1_900_000_000, tz=datetime.UTC)


def test_a_rotated_token_file_is_read_again_at_the_next_login(tmp_path: Path) -> None:
    directory = service_account(tmp_path / "sa", token=jwt({"exp": 1}))
    settings = kopf.OperatorSettings()
    first = login.credentials(
        env=IN_POD, home=tmp_path, service_account_dir=directory, settings=settings
    )
    (directory / "token").write_text(jwt({"exp": 2}))
    second = login.credentials(
        env=IN_POD, home=tmp_path, service_account_dir=directory, settings=settings
    )
    assert first.token != second.token and second.token == jwt({"exp": 2})
    assert second.ca_path == str(directory / "ca.crt")


def test_a_kubeconfig_wins_over_the_service_account_as_it_does_for_kr8s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "from-kubeconfig"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    directory = service_account(tmp_path / "sa", token="from-service-account")
    info = login.credentials(
        env={**IN_POD, "KUBECONFIG": str(path)},
        home=tmp_path,
        service_account_dir=directory,
        settings=kopf.OperatorSettings(),
    )
    assert (info.server, info.token) == ("https://127.0.0.1:6443", "from-kubeconfig")


def test_a_kubeconfig_named_but_absent_leaves_the_service_account(tmp_path: Path) -> None:
    assert not login.kubeconfig_found({"KUBECONFIG": str(tmp_path / "none")}, home=tmp_path)
    assert not login.kubeconfig_found({}, home=tmp_path)
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert login.kubeconfig_found({}, home=tmp_path)


def test_with_no_credentials_at_all_the_login_says_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(kopf.PermanentError, match="KUBERNETES_SERVICE_HOST"):
        login.credentials(
            env={}, home=tmp_path, service_account_dir=tmp_path, settings=kopf.OperatorSettings()
        )


def test_the_operator_logs_in_from_its_pod_without_the_kubernetes_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The image installs no `kubernetes` package, no kubeconfig is there, and
    # no cluster DNS: only the pod's environment and ServiceAccount files.
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    monkeypatch.setitem(sys.modules, "kubernetes.config", None)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in IN_POD.items():
        monkeypatch.setenv(name, value)
    directory = service_account(tmp_path / "sa", token=jwt({"exp": 1_900_000_000}))
    monkeypatch.setattr(login, "SERVICE_ACCOUNT_DIR", directory)
    info = login.login(settings=kopf.OperatorSettings(), logger=logging.getLogger("t"))
    assert info is not None and info.server == "https://10.96.0.1:443"
