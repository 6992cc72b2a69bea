"""The pod runner's rule for pods of the shoal image (routers, helm test pods):
they run `shoal ...` as the pod's ServiceAccount, with their ConfigMap and
Secret volumes as local files, listening on the pod IP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoal_testbed import podfs, rules


def _router_pod(image: str = "ghcr.io/shoal-dev/shoal:0.1.0") -> dict[str, Any]:
    return {
        "metadata": {"name": "c-router-abc", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "serviceAccountName": "c-router",
            "containers": [
                {
                    "name": "router",
                    "image": image,
                    "command": ["shoal"],
                    "args": [
                        "router",
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "8000",
                        "--config",
                        "/etc/shoal/router/router.json",
                        "--namespace",
                        "$(NS)",
                    ],
                    "env": [
                        {
                            "name": "NS",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        }
                    ],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/shoal/router", "readOnly": True},
                        {"name": "keys", "mountPath": "/etc/shoal/api-keys"},
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "c-router"}},
                {"name": "keys", "secret": {"secretName": "api-keys"}},
            ],
        },
        "status": {"phase": "Running", "podIP": "127.7.6.5"},
    }


def test_shoal_image_pods_run_their_shoal_command_on_the_pod_ip_as_their_service_account() -> None:
    launch = rules.shoal_pod(_router_pod())
    assert launch is not None
    assert launch.argv[1:] == [
        "-m",
        "shoal.cli",
        "router",
        "--host",
        "127.7.6.5",
        "--port",
        "8000",
        "--config",
        "/etc/shoal/router/router.json",
        "--namespace",
        "ns",
    ]
    assert launch.service_account == "c-router"
    assert {(m.kind, m.name, m.path) for m in launch.mounts} == {
        ("configMap", "c-router", "/etc/shoal/router"),
        ("secret", "api-keys", "/etc/shoal/api-keys"),
    }


def test_the_rule_recognises_the_shoal_repository_only() -> None:
    for image in ("shoal", "shoal:dev", "registry.local:5000/team/shoal@sha256:abc"):
        assert rules.is_shoal_image(image), image
    for image in ("vllm/vllm-openai:v0.32.0", "shoal-tools:1", "ghcr.io/shoal/other:1"):
        assert not rules.is_shoal_image(image), image
    assert rules.shoal_pod(_router_pod("busybox")) is None


def test_pods_without_a_service_account_name_use_default_and_host_equals_form_is_moved() -> None:
    pod = _router_pod()
    del pod["spec"]["serviceAccountName"]
    pod["spec"]["containers"][0]["args"] = ["router", "--host=0.0.0.0"]
    launch = rules.shoal_pod(pod)
    assert launch is not None
    assert launch.service_account == "default"
    assert launch.argv[-1] == "--host=127.7.6.5"


def test_paths_under_mounts_move_under_the_pod_root_and_others_stay() -> None:
    mounts = (podfs.Mount(path="/etc/shoal/router", kind="configMap", name="c"),)
    root = Path("/tmp/pod-root")
    argv = ["--config", "/etc/shoal/router/router.json", "--x=/etc/shoal/router/a", "/etc/shoal"]
    assert podfs.relocate(argv, mounts, root) == [
        "--config",
        "/tmp/pod-root/etc/shoal/router/router.json",
        "--x=/tmp/pod-root/etc/shoal/router/a",
        "/etc/shoal",
    ]


def test_volumes_are_written_and_swapped_as_kubelets_atomic_writer_does(tmp_path: Path) -> None:
    volume = tmp_path / "etc" / "keys"
    assert podfs.write_volume(volume, {"keys.txt": b"sk-1\n", "conf/a.json": b"{}"})
    assert (volume / "keys.txt").is_symlink()
    assert (volume / "keys.txt").read_bytes() == b"sk-1\n"
    assert (volume / "conf" / "a.json").read_bytes() == b"{}"
    first = (volume / "..data").readlink()
    inode = (volume / "keys.txt").stat().st_ino

    assert not podfs.write_volume(volume, {"keys.txt": b"sk-1\n", "conf/a.json": b"{}"})
    assert (volume / "..data").readlink() == first  # unchanged: nothing rewritten

    assert podfs.write_volume(volume, {"keys.txt": b"sk-2\n"})
    assert (volume / "keys.txt").read_bytes() == b"sk-2\n"
    assert (volume / "keys.txt").stat().st_ino != inode  # what a reader's stat sees
    assert not (volume / "conf").exists()  # a key gone from the Secret goes
    assert not (volume / first).exists()  # the old generation is removed
    assert sorted(p.name for p in volume.iterdir() if not p.name.startswith("..")) == ["keys.txt"]


def test_service_account_kubeconfig_uses_the_token_and_the_pods_namespace() -> None:
    config = podfs.service_account_kubeconfig(
        server="https://127.0.0.1:6443", ca_file="/pki/ca.crt", token="t0k", namespace="ns"
    )
    assert config["users"][0]["user"] == {"token": "t0k"}
    assert config["clusters"][0]["cluster"]["certificate-authority"] == "/pki/ca.crt"
    assert config["contexts"][0]["context"]["namespace"] == "ns"
    assert "client-certificate" not in str(config)


def test_addresses_of_all_interfaces_move_to_the_pod_ip() -> None:
    args = ["operator", "--liveness=http://0.0.0.0:8080/healthz", "--log-level=INFO"]
    assert rules.bind_to_pod_ip(args, "127.7.1.2") == [
        "operator",
        "--liveness=http://127.7.1.2:8080/healthz",
        "--log-level=INFO",
    ]
