"""The pod runner against an API server that goes away: it keeps running its
pods (no I/O beyond a fake API; processes are stand-ins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import urllib3

from shoal_testbed.podfs import Mount
from shoal_testbed.podrunner import PodRunner, Running
from shoal_testbed.rules import Launch


class _GoneApi:
    """Every call fails as the client does while kube-apiserver restarts."""

    def __getattr__(self, name: str) -> Any:
        def call(*_args: Any, **_kwargs: Any) -> Any:
            raise urllib3.exceptions.MaxRetryError(None, "/api/v1", "connection refused")  # type: ignore[arg-type]

        return call


class _LiveProcess:
    pid = 12345

    def poll(self) -> int | None:
        return None


POD: dict[str, Any] = {
    "metadata": {"name": "router-0", "namespace": "ns", "uid": "u-1"},
    "spec": {"containers": [{"name": "router", "image": "shoal:0.1.0"}]},
    "status": {"phase": "Running", "podIP": "127.0.0.9"},
}


def test_a_volume_refresh_during_an_api_server_restart_keeps_the_pod_running(
    tmp_path: Path,
) -> None:
    runner = PodRunner(api=_GoneApi(), rules=(), log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    launch = Launch(argv=["true"], mounts=(Mount(path="/etc/r", kind="configMap", name="r"),))
    entry = Running(pod=POD, launch=launch, process=_LiveProcess())  # type: ignore[arg-type]
    runner.running["u-1"] = entry
    runner.pods = {"u-1": POD}
    runner.supervise_once()
    assert runner.running["u-1"].process is entry.process
