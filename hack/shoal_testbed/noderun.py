"""The real node's init, run inside its network namespace and a mount namespace
of its own (`nodehost` starts it there): containerd, the images imported from
the local builds, kubelet, kube-proxy and kube-router's firewall (NetworkPolicy),
as kind's node container runs them.

It exits when any of them exits (the testbed's supervisor starts it again) and
stops them on SIGTERM. The pods' containers are the host side's to remove
(`nodehost.teardown` empties the node's cgroups).

Run as `python -m shoal_testbed.noderun --layout L.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from shoal_testbed import procs
from shoal_testbed.realnode import CONTAINERD_NAMESPACE, NODE_NAME, NodeLayout

log = logging.getLogger("noderun")


def _sysctl(name: str, value: str) -> None:
    Path("/proc/sys", *name.split(".")).write_text(value)


def _start(name: str, argv: list[str], *, logs: Path) -> subprocess.Popen[bytes]:
    log.info("starting %s", name)
    out = (logs / f"node-{name}.log").open("ab")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def archive_image_id(archive: Path) -> str:
    """The image ID (its config's digest) in a docker-archive: what containerd
    holds after importing it, whatever the tag."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None, f"{archive}: no manifest.json"
        (entry,) = json.load(member)
    return "sha256:" + Path(entry["Config"]).stem


def containerd_image_ids(ctr: list[str]) -> dict[str, str]:
    """Each image name containerd holds, with its ID (its config's digest)."""
    listed = subprocess.run(
        [*ctr, "images", "ls"], check=True, capture_output=True, text=True, timeout=60
    ).stdout.splitlines()[1:]
    ids: dict[str, str] = {}
    for row in listed:
        name, _media_type, digest, *_ = row.split()
        manifest = _content(ctr, digest)
        if "manifests" in manifest:  # an index: its (only) platform's manifest
            manifest = _content(ctr, manifest["manifests"][0]["digest"])
        ids[name] = manifest["config"]["digest"]
    return ids


def _content(ctr: list[str], digest: str) -> dict[str, Any]:
    blob = subprocess.run(
        [*ctr, "content", "get", digest], check=True, capture_output=True, timeout=60
    ).stdout
    loaded: dict[str, Any] = json.loads(blob)
    return loaded


def stale_images(wanted: Mapping[str, str], present: Mapping[str, str]) -> list[str]:
    """The names (of wanted: name -> image ID) that containerd lacks or holds
    at another ID: a rebuilt :dev image keeps its name."""
    return [name for name, image_id in wanted.items() if present.get(name) != image_id]


def import_images(ctr: list[str], archives: list[Path]) -> list[str]:
    """Import each archive whose image is stale in containerd (a restarted
    node keeps its images: the testbed's data lives until its teardown).
    The names imported."""
    by_name = {a.with_suffix(".name").read_text().strip(): a for a in archives}
    wanted = {name: archive_image_id(archive) for name, archive in by_name.items()}
    stale = stale_images(wanted, containerd_image_ids(ctr))
    for name in stale:
        log.info("importing %s as %s", by_name[name], name)
        subprocess.run([*ctr, "images", "import", str(by_name[name])], check=True, timeout=600)
    return stale


def ctr_command(layout: NodeLayout, *, node_bin: Path) -> list[str]:
    return [
        str(node_bin / "ctr"),
        f"--address={layout.containerd_socket}",
        f"--namespace={CONTAINERD_NAMESPACE}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shoal_testbed.noderun", description=__doc__)
    parser.add_argument("--layout", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    spec = json.loads(args.layout.read_text())
    layout = NodeLayout(octet=spec["octet"], state_dir=Path(spec["state_dir"]))
    binaries, node_bin = Path(spec["bin_dir"]), Path(spec["node_bin_dir"])
    logs = Path(spec["logs"])
    conf = layout.config_dir

    # This namespace is the node's: forward pod traffic, and let kube-proxy's
    # rules see bridged packets (a pod reaching a Service backed by a pod on
    # the same bridge).
    _sysctl("net.ipv4.ip_forward", "1")
    _sysctl("net.bridge.bridge-nf-call-iptables", "1")
    os.environ["PATH"] = f"{node_bin}:/usr/sbin:/usr/bin:/sbin:/bin"

    children: dict[str, subprocess.Popen[bytes]] = {}

    def stop(signum: int, _frame: FrameType | None) -> None:
        for name in ("kube-router", "kube-proxy", "kubelet", "containerd"):
            if (child := children.get(name)) is not None and child.poll() is None:
                child.terminate()
        for child in children.values():
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    children["containerd"] = _start(
        "containerd",
        [str(node_bin / "containerd"), f"--config={conf / 'containerd.toml'}"],
        logs=logs,
    )
    procs.wait_until(
        layout.containerd_socket.exists,
        what="containerd's socket",
        timeout_seconds=60,
        is_alive=lambda: children["containerd"].poll() is None,
        log_path=logs / "node-containerd.log",
    )
    import_images(ctr_command(layout, node_bin=node_bin), [Path(p) for p in spec["images"]])

    children["kubelet"] = _start(
        "kubelet", [str(binaries / "kubelet"), *spec["kubelet_args"]], logs=logs
    )
    children["kube-proxy"] = _start(
        "kube-proxy",
        [str(binaries / "kube-proxy"), f"--config={conf / 'kube-proxy.yaml'}"],
        logs=logs,
    )
    # NetworkPolicy, enforced by kube-router's firewall alone (kube-proxy
    # serves Services, the bridge plugin routes pods). It exits until kubelet
    # has registered the node, so it is started again, as its DaemonSet pod
    # would be.
    firewall = [
        str(node_bin / "kube-router"),
        f"--kubeconfig={conf / 'admin.kubeconfig'}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        "--health-port=0",
        "--metrics-port=0",
    ]
    children["kube-router"] = _start("kube-router", firewall, logs=logs)
    (layout.run_dir / "node.ready").write_text(str(os.getpid()))
    while True:
        for name, child in list(children.items()):
            if (code := child.poll()) is None:
                continue
            if name == "kube-router":
                log.warning("kube-router exited with %s; starting it again", code)
                children[name] = _start(name, firewall, logs=logs)
                continue
            log.error("%s exited with %s; stopping the node", name, code)
            stop(signal.SIGTERM, None)
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
