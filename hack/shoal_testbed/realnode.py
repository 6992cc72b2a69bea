"""The testbed's real node, as plain data: its names, addresses and the
configuration files of containerd, CNI, kubelet and kube-proxy.

One node per testbed, in network namespaces the testbed creates (as kind keeps
its node in a container): the node's namespace holds kubelet, containerd,
kube-proxy and the CNI bridge; each pod gets its own namespace behind that
bridge. A veth pair joins the node's namespace to the host's; the host routes
the node's pod subnet to it and nothing else, and nothing is NATed off the
machine. Every address is derived from the testbed's pod octet, so two
testbeds on one machine never collide. See docs/real-node.md.

I/O lives in `nodehost` (host side) and `noderun` (inside the namespace).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shoal_testbed.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE

NODE_NAME = "real-node-0"
# Only pods that tolerate this taint land on the real node: the testbed's
# other tests keep their pods on the kwok nodes, where the pod runner plays them.
REAL_NODE_LABEL = "shoal.dev/real-node"
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
REAL_NODE_TOLERATION = {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPUS = 8
KUBELET_PORT = 10250
CONTAINERD_NAMESPACE = "k8s.io"
# The cgroup v1 hierarchies the host mounts and kubelet checks (docs/real-node.md
# says why the node stays on v1); name=systemd is one too, without a controller.
CGROUP_CONTROLLERS = (
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
    "pids",
    "systemd",
)
# Debian's containernetworking-plugins.
CNI_BIN_DIR = "/usr/lib/cni"


@dataclass(frozen=True)
class NodeLayout:
    """Where one testbed's node lives: namespace, links, subnets, directories."""

    octet: int
    state_dir: Path  # the testbed's directory/node: kubelet, containerd data, logs

    @property
    def netns(self) -> str:
        return f"shoal-node-{self.octet}"

    @property
    def host_link(self) -> str:
        return f"shoal{self.octet}h"  # <= 15 characters (IFNAMSIZ)

    @property
    def node_link(self) -> str:
        return f"shoal{self.octet}n"

    @property
    def host_ip(self) -> str:
        """The host's end of the veth: the API server is reached here."""
        return f"10.{self.octet}.255.1"

    @property
    def node_ip(self) -> str:
        return f"10.{self.octet}.255.2"

    @property
    def link_prefix(self) -> int:
        return 30

    @property
    def pod_cidr(self) -> str:
        return f"10.{self.octet}.0.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.{self.octet}.0.1"

    @property
    def cgroup(self) -> str:
        """The node's cgroup (kubelet's cgroupRoot) in every v1 hierarchy."""
        return f"/shoal-node-{self.octet}"

    @property
    def run_dir(self) -> Path:
        """Sockets and runtime state: short paths (a unix socket's is at most 107 bytes)."""
        return Path(f"/run/shoal-node-{self.octet}")

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.state_dir / "kubelet"

    @property
    def pod_logs_dir(self) -> Path:
        return self.state_dir / "pods-logs"

    @property
    def containerd_root(self) -> Path:
        return self.state_dir / "containerd"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni"

    @property
    def config_dir(self) -> Path:
        return self.state_dir / "config"


def containerd_config(layout: NodeLayout, *, sandbox_image: str) -> str:
    """containerd 2.x's config (version 3): its own root, state and socket, runc
    with cgroupfs (no systemd here), CNI from Debian's plugins, the local pause
    image, pod network namespaces under its state directory."""
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return "\n".join(
        [
            "version = 3",
            f"root = {json.dumps(str(layout.containerd_root))}",
            f"state = {json.dumps(str(layout.run_dir / 'containerd'))}",
            "[grpc]",
            f"  address = {json.dumps(str(layout.containerd_socket))}",
            f"[{runtime}]",
            "  enable_selinux = false",
            # The host mounts no hugetlb hierarchy.
            "  tolerate_missing_hugetlb_controller = true",
            # This machine's root lacks CAP_SYS_RESOURCE: an OOM score below
            # containerd's own (kubelet asks -998 for the sandbox) is refused.
            "  restrict_oom_score_adj = true",
            # Pod netns bind mounts under the state dir, not the host's /run/netns.
            "  netns_mounts_under_state_dir = true",
            f"[{runtime}.containerd]",
            "  default_runtime_name = 'runc'",
            f"[{runtime}.containerd.runtimes.runc]",
            "  runtime_type = 'io.containerd.runc.v2'",
            f"[{runtime}.containerd.runtimes.runc.options]",
            "  BinaryName = '/usr/sbin/runc'",
            # runc's state beside containerd's, not in the host's /run/containerd.
            f"  Root = {json.dumps(str(layout.run_dir / 'runc'))}",
            "  SystemdCgroup = false",
            f"[{runtime}.cni]",
            f"  bin_dirs = [{json.dumps(CNI_BIN_DIR)}]",
            f"  conf_dir = {json.dumps(str(layout.cni_conf_dir))}",
            "[plugins.'io.containerd.cri.v1.images']",
            "  snapshotter = 'overlayfs'",
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"  sandbox = {json.dumps(sandbox_image)}",
            "[plugins.'io.containerd.grpc.v1.cri']",
            "  stream_server_address = '127.0.0.1'",
            "",
        ]
    )


def cni_config(layout: NodeLayout) -> dict[str, Any]:
    """bridge + host-local on the node's pod subnet, portmap chained;
    containerd brings up each pod's lo with the loopback plugin itself."""
    return {
        "cniVersion": "1.0.0",
        "name": "shoal-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                # A pod reaching itself through a Service.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": layout.pod_cidr, "gateway": layout.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.run_dir / "cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


# Below this share of free disk (or inodes) the kubelet removes images, then
# evicts pods: with `imagePullPolicy: Never` nothing starts again.
EVICTION_FREE_PERCENT = 1


def kubelet_config(layout: NodeLayout, *, ca_file: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Kubernetes 1.36's kubelet refuses cgroup v1 unless told otherwise;
        # the host's hierarchies are v1 (docs/real-node.md).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": layout.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(layout.pod_logs_dir),
        "failSwapOn": False,
        "registerWithTaints": [REAL_NODE_TAINT],
        # No cluster DNS in the testbed: pods get the node's resolv.conf.
        "resolvConf": "",
        "clusterDomain": "cluster.local",
        # A shared machine's disk and memory are not the node's to defend.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": f"{EVICTION_FREE_PERCENT}%",
            "imagefs.available": f"{EVICTION_FREE_PERCENT}%",
            "nodefs.inodesFree": f"{EVICTION_FREE_PERCENT}%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # Secrets and ConfigMaps reach running pods within seconds (the default
        # is a minute plus a cache TTL).
        "syncFrequency": "10s",
        "configMapAndSecretChangeDetectionStrategy": "Watch",
        "maxPods": 50,
        "localStorageCapacityIsolation": True,
    }


def kubelet_args(layout: NodeLayout, *, kubeconfig: Path, config: Path) -> list[str]:
    labels = {
        GPU_PRODUCT_LABEL: GPU_PRODUCT,
        "nvidia.com/gpu.count": str(GPUS),
        REAL_NODE_LABEL: "true",
    }
    return [
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={layout.kubelet_dir}",
        f"--cert-dir={layout.kubelet_dir / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={layout.node_ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
        "--v=1",
    ]


def kube_proxy_config(layout: NodeLayout, *, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": layout.pod_cidr,
        "hostnameOverride": NODE_NAME,
        "bindAddress": layout.node_ip,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        # conntrack's table size and timeouts are the host's: leave them.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def gpu_status_patch() -> list[dict[str, Any]]:
    """JSON patch for the node's status: 8 fake GPUs (nothing on the node
    backs them; engine pods run the simulator)."""
    path_key = GPU_RESOURCE.replace("/", "~1")
    return [
        {"op": "add", "path": f"/status/capacity/{path_key}", "value": str(GPUS)},
        {"op": "add", "path": f"/status/allocatable/{path_key}", "value": str(GPUS)},
    ]


def write_configs(layout: NodeLayout, *, pki_dir: Path, sandbox_image: str) -> None:
    """Every file the node's processes read, into layout.config_dir."""
    conf = layout.config_dir
    conf.mkdir(parents=True, exist_ok=True)
    layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    (conf / "containerd.toml").write_text(containerd_config(layout, sandbox_image=sandbox_image))
    (layout.cni_conf_dir / "10-shoal-node.conflist").write_text(
        json.dumps(cni_config(layout), indent=2)
    )
    (conf / "kubelet.yaml").write_text(
        yaml.safe_dump(kubelet_config(layout, ca_file=pki_dir / "ca.crt"))
    )
    (conf / "kube-proxy.yaml").write_text(
        yaml.safe_dump(kube_proxy_config(layout, kubeconfig=conf / "kube-proxy.kubeconfig"))
    )
