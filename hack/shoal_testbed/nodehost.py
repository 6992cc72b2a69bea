"""The host's side of the testbed's real node: the network namespace and veth
it lives behind, its cgroups, the command that starts its init (`noderun`)
inside them, and a teardown that leaves nothing behind (processes, mounts,
interfaces, iptables rules, cgroups, files).

Needs root (network namespaces, cgroups, mounts), the binaries
hack/testbed/build.sh and hack/node/build.sh make, and the images
hack/image/build.sh makes. `missing()` says what is absent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from shoal_testbed import noderun, procs, realnode
from shoal_testbed.realnode import CGROUP_CONTROLLERS, NodeLayout

if TYPE_CHECKING:
    from shoal_testbed.cluster import Testbed

log = logging.getLogger("shoal_testbed.node")

CGROUP_ROOT = Path("/sys/fs/cgroup")
# What the node's processes need from the host's PATH.
HOST_TOOLS = ("ip", "nsenter", "unshare", "iptables", "runc", "conntrack")
# Disable the node with SHOAL_TESTBED_NODE=0 (make testbed-up starts it).
ENV_SWITCH = "SHOAL_TESTBED_NODE"


def wanted_by_default() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def images_dir(repo: Path) -> Path:
    return repo / ".testbed" / "images"


def node_bin_dir(repo: Path) -> Path:
    return repo / ".testbed" / "node-bin"


def image_archives(repo: Path) -> list[Path]:
    """The pause, shoal and shoal-engine-sim archives the node imports."""
    pause = node_bin_dir(repo).resolve().parent / "pause.tar"
    images = images_dir(repo)
    return [pause, images / "shoal.tar", images / "shoal-engine-sim.tar"]


def pause_image(repo: Path) -> str:
    return (node_bin_dir(repo).resolve().parent / "pause.name").read_text().strip()


# Free disk the node needs above its kubelet's eviction threshold: the images
# imported into containerd (about 1 GB), the pods' logs and volumes, and room.
DISK_HEADROOM = 4 * 2**30


def disk_shortfall(path: Path) -> str | None:
    """Why a real node keeping its data at `path` would run out of disk, or None."""
    while not path.exists():
        path = path.parent
    usage = shutil.disk_usage(path)
    evicts_below = usage.total * realnode.EVICTION_FREE_PERCENT // 100
    if usage.free >= evicts_below + DISK_HEADROOM:
        return None
    gib = 2**30
    return (
        f"{usage.free / gib:.1f} GiB free on the disk of {path}: the real node's kubelet removes"
        f" its images below {evicts_below / gib:.1f} GiB ({realnode.EVICTION_FREE_PERCENT}%) and"
        f" the node needs {DISK_HEADROOM // gib} GiB above that. Free some: build caches are in"
        " ~/.cache/shoal, buildah's images in /var/lib/containers (podman image prune)"
    )


def missing(repo: Path, bin_dir: Path) -> list[str]:
    """What the real node lacks here, in words a `make` target fixes."""
    gaps: list[str] = []
    if os.geteuid() != 0:
        gaps.append("root (network namespaces, cgroups, mounts)")
    if not (CGROUP_ROOT / "memory").is_dir():
        gaps.append("cgroup v1 hierarchies at /sys/fs/cgroup (docs/real-node.md)")
    gaps += [f"{t} on PATH" for t in HOST_TOOLS if shutil.which(t) is None]
    gaps += [f"{b} (make testbed)" for b in ("kubelet", "kube-proxy") if not (bin_dir / b).exists()]
    gaps += [
        f"{b} (bash hack/node/build.sh)"
        for b in ("containerd", "kube-router")
        if not (node_bin_dir(repo) / b).exists()
    ]
    gaps += [f"{a} (make image)" for a in image_archives(repo) if not a.exists()]
    return gaps


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)


def _in_node(layout: NodeLayout, *args: str) -> None:
    _ip("netns", "exec", layout.netns, "ip", *args)


def prepare_network(layout: NodeLayout) -> None:
    """The node's namespace, joined to the host by one veth pair; the host
    routes the node's pod subnet to it. No default route inside: what is not
    the host or a pod has nowhere to go, so nothing leaves the machine."""
    _ip("netns", "add", layout.netns)
    _ip("link", "add", layout.host_link, "type", "veth", "peer", "name", layout.node_link)
    _ip("link", "set", layout.node_link, "netns", layout.netns)
    _ip("addr", "add", f"{layout.host_ip}/{layout.link_prefix}", "dev", layout.host_link)
    _ip("link", "set", layout.host_link, "up")
    _in_node(layout, "link", "set", "lo", "up")
    _in_node(
        layout, "addr", "add", f"{layout.node_ip}/{layout.link_prefix}", "dev", layout.node_link
    )
    _in_node(layout, "link", "set", layout.node_link, "up")
    _ip("route", "add", layout.pod_cidr, "via", layout.node_ip, "dev", layout.host_link)


def prepare_cgroups(layout: NodeLayout) -> None:
    """kubelet's cgroupRoot must exist; the node's init joins <root>/node."""
    for controller in CGROUP_CONTROLLERS:
        base = CGROUP_ROOT / controller
        for path in (base / layout.cgroup.lstrip("/"), base / layout.cgroup.lstrip("/") / "node"):
            path.mkdir(exist_ok=True)
            if controller == "cpuset":
                # A new v1 cpuset starts empty: no task may join until it has CPUs.
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((path.parent / knob).read_text())


def launch_argv(layout: NodeLayout, *, spec_file: Path) -> list[str]:
    """The node's init: in its network namespace and a mount namespace of its
    own (mounts made there, the containers' root filesystems and volumes, go
    when its last process does), in its cgroup."""
    procs_files = [
        str(CGROUP_ROOT / c / layout.cgroup.lstrip("/") / "node" / "cgroup.procs")
        for c in CGROUP_CONTROLLERS
    ]
    join = "; ".join(f"echo $$ > {f}" for f in procs_files)
    return [
        "nsenter",
        f"--net=/run/netns/{layout.netns}",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "slave",
        "--",
        "sh",
        "-c",
        f'{join}; exec "$0" -m shoal_testbed.noderun --layout "$1"',
        sys.executable,
        str(spec_file),
    ]


def write_spec(
    layout: NodeLayout, *, repo: Path, bin_dir: Path, logs: Path, kubelet_args: list[str]
) -> Path:
    spec_file = layout.config_dir / "layout.json"
    spec_file.write_text(
        json.dumps(
            {
                "octet": layout.octet,
                "state_dir": str(layout.state_dir),
                "bin_dir": str(bin_dir),
                "node_bin_dir": str(node_bin_dir(repo).resolve()),
                "logs": str(logs),
                "images": [str(a.resolve()) for a in image_archives(repo)],
                "kubelet_args": kubelet_args,
            },
            indent=2,
        )
    )
    return spec_file


def start(bed: Testbed) -> None:
    """Start the node's init under the testbed's supervisor, wait for the node
    to be Ready, and give it its fake GPUs."""
    from shoal_testbed.cluster import REPO, _kubeconfig, bin_dir

    assert bed.state is not None
    if gaps := missing(REPO, bin_dir()):
        raise RuntimeError(f"the real node needs: {'; '.join(gaps)} (or {ENV_SWITCH}=0)")
    layout = bed.state.node_layout()
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    realnode.write_configs(layout, pki_dir=bed.pki, sandbox_image=pause_image(REPO))
    server = f"https://{layout.host_ip}:{bed.state.apiserver_port}"
    # kube-router reads pods, namespaces and NetworkPolicies of every namespace.
    for stem in ("node", "kube-proxy", "admin"):
        config = _kubeconfig(server, bed.pki, stem)
        (layout.config_dir / f"{stem}.kubeconfig").write_text(yaml.safe_dump(config))
    kubelet_args = realnode.kubelet_args(
        layout,
        kubeconfig=layout.config_dir / "node.kubeconfig",
        config=layout.config_dir / "kubelet.yaml",
    )
    spec_file = write_spec(
        layout, repo=REPO, bin_dir=bin_dir().resolve(), logs=bed.logs, kubelet_args=kubelet_args
    )
    prepare_cgroups(layout)
    pid = bed._launch("real-node", launch_argv(layout, spec_file=spec_file))
    procs.wait_until(
        lambda: (
            "True"
            in bed.kubectl(
                "get",
                "node",
                realnode.NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
        ),
        what=f"node {realnode.NODE_NAME} Ready",
        timeout_seconds=240,
        is_alive=lambda: procs.alive(pid),
        log_path=bed.logs / "real-node.log",
    )
    bed.kubectl(
        "patch",
        "node",
        realnode.NODE_NAME,
        "--subresource=status",
        "--type=json",
        "-p",
        json.dumps(realnode.gpu_status_patch()),
    )
    log.info("real node %s Ready in %s", realnode.NODE_NAME, layout.netns)


def sync_images(layout: NodeLayout, *, repo: Path) -> list[str]:
    """A running node takes up the images built since it started (`make image`
    after `make testbed-up`: same names, new IDs). The names imported."""
    ctr = noderun.ctr_command(layout, node_bin=node_bin_dir(repo).resolve())
    return noderun.import_images(ctr, [a.resolve() for a in image_archives(repo)])


@contextlib.contextmanager
def route_to_service(layout: NodeLayout, cluster_ip: str) -> Iterator[None]:
    """The host reaches one ClusterIP through the node's kube-proxy (a /32 via
    the node, removed after)."""
    _ip("route", "replace", f"{cluster_ip}/32", "via", layout.node_ip, "dev", layout.host_link)
    try:
        yield
    finally:
        _ip("route", "del", f"{cluster_ip}/32", check=False)


# ---- teardown


def _netns_pids(layout: NodeLayout) -> set[int]:
    result = subprocess.run(
        ["ip", "netns", "pids", layout.netns], capture_output=True, text=True, timeout=30
    )
    return {int(p) for p in result.stdout.split()} if result.returncode == 0 else set()


def _cgroup_dirs(layout: NodeLayout) -> list[Path]:
    """Every cgroup of the node, deepest first."""
    found: list[Path] = []
    for controller in CGROUP_CONTROLLERS:
        root = CGROUP_ROOT / controller / layout.cgroup.lstrip("/")
        if root.is_dir():
            found += [Path(d) for d, _, _ in os.walk(root)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids(layout: NodeLayout) -> set[int]:
    pids: set[int] = set()
    for directory in _cgroup_dirs(layout):
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
    return pids


def node_pids(layout: NodeLayout) -> set[int]:
    """Every process of the node: its init, containerd's shims (in the node's
    namespace) and the containers (in the node's cgroups)."""
    return _netns_pids(layout) | _cgroup_pids(layout)


def teardown(layout: NodeLayout) -> None:
    """Stop every process of the node, then remove its cgroups, namespace
    (with the veth, its routes and kube-proxy's iptables rules) and files.
    Idempotent: it clears what a crashed run left too."""
    deadline = time.monotonic() + 30
    while (pids := node_pids(layout)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    if pids := node_pids(layout):
        log.warning("real node: processes survived teardown: %s", sorted(pids))
    for directory in _cgroup_dirs(layout):
        with contextlib.suppress(OSError):
            directory.rmdir()
    _ip("netns", "del", layout.netns, check=False)
    _ip("link", "del", layout.host_link, check=False)
    shutil.rmtree(layout.run_dir, ignore_errors=True)
    shutil.rmtree(layout.state_dir, ignore_errors=True)


def leftovers(layout: NodeLayout) -> list[str]:
    """What of the node is still on the machine (empty after a teardown)."""
    found: list[str] = []
    if pids := node_pids(layout):
        found.append(f"processes {sorted(pids)}")
    if _cgroup_dirs(layout):
        found.append(f"cgroups {layout.cgroup}")
    if Path("/run/netns", layout.netns).exists():
        found.append(f"network namespace {layout.netns}")
    if Path("/sys/class/net", layout.host_link).exists():
        found.append(f"interface {layout.host_link}")
    for path in (layout.run_dir, layout.state_dir):
        if path.exists():
            found.append(f"directory {path}")
    # kube-proxy's rules live in the node's namespace; none may reach the host's.
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=30).stdout
    if "KUBE-" in rules:
        found.append("kube-proxy's iptables rules in the host's namespace")
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            mount_point = line.split()[4]
            if str(layout.state_dir) in mount_point or str(layout.run_dir) in mount_point:
                found.append(f"mount {mount_point}")
    return found
