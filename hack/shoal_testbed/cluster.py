"""The testbed: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok and the pod runner, started from the binaries hack/testbed/build.sh makes.

State lives in one directory (``.testbed`` for ``make testbed-up``, a temporary
one for a pytest run that found none running): ``kubeconfig``, ``pki/``,
``logs/`` and ``state.json`` with the ports and process ids, so ``down`` and
later test runs can find a running testbed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import ssl
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shoal_testbed import nodehost, nodes, pki, procs, realnode

log = logging.getLogger("shoal_testbed")

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "testbed"
DEFAULT_DIR = REPO / ".testbed"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"  # ClusterIPs are only allocated; nothing routes to them here
# kube-controller-manager's and kube-scheduler's leader election renew deadline (their default).
CONTROLLERS_RENEW_DEADLINE_SECONDS = 10.0


def bin_dir() -> Path:
    override = os.environ.get("SHOAL_TESTBED_BIN")
    return Path(override) if override else DEFAULT_DIR / "bin"


def missing_binaries() -> list[str]:
    wanted = (*COMPONENTS, "kubectl", "helm")
    return [name for name in wanted if not (bin_dir() / name).exists()]


def pins() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (HACK / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


@dataclass
class State:
    """What a running testbed needs to be found again and stopped."""

    directory: str
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    controller_manager_port: int
    scheduler_port: int
    kwok_port: int
    pod_octet: int
    pids: dict[str, int] = field(default_factory=dict)
    started_seconds: float = 0.0
    real_node: bool = False  # hack/shoal_testbed/nodehost.py

    def node_layout(self) -> realnode.NodeLayout:
        return realnode.NodeLayout(octet=self.pod_octet, state_dir=Path(self.directory) / "node")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


class Testbed:
    """A running (or startable) control plane in one state directory."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self, directory: Path, *, owned_by_caller: bool = False, real_node: bool = False
    ) -> None:
        self.dir = directory.resolve()
        self.real_node = real_node
        # A testbed owned by a pytest run dies with it; see procs.
        self.owned_by_caller = owned_by_caller
        self.state: State | None = None

    # ---- paths
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def component_kubeconfig(self, stem: str) -> Path:
        return self.pki / f"{stem}.kubeconfig"

    # ---- discovery of a running testbed
    @classmethod
    def attach(cls, directory: Path) -> Testbed | None:
        """The testbed running in directory, or None if none answers there."""
        bed = cls(directory)
        if not bed.state_file.exists():
            return None
        bed.state = State(**json.loads(bed.state_file.read_text()))
        return bed if bed.healthy() else None

    def healthy(self) -> bool:
        if self.state is None:
            return False
        if not all(procs.alive(pid) for pid in self.state.pids.values()):
            return False
        return procs.http_ok(f"{self.state.server}/readyz", context=self._client_tls("admin"))

    def _client_tls(self, stem: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / f"{stem}.crt"), str(self.pki / f"{stem}.key"))
        return context

    # ---- start
    def up(self) -> State:
        if missing := missing_binaries():
            raise RuntimeError(
                f"testbed binaries missing in {bin_dir()}: {', '.join(missing)}; run `make testbed`"
            )
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in ("etcd-data", "pki", "kwok", "state.json"):
            path = self.dir / stale
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        self.state = State(
            directory=str(self.dir),
            etcd_port=procs.free_port(),
            etcd_peer_port=procs.free_port(),
            apiserver_port=procs.free_port(),
            controller_manager_port=procs.free_port(),
            scheduler_port=procs.free_port(),
            kwok_port=procs.free_port(),
            pod_octet=_free_pod_octet(),
            real_node=self.real_node,
        )
        extra_ips: tuple[str, ...] = ()
        if self.real_node:
            self._save()  # a failed start's down() finds the node to remove
            layout = self.state.node_layout()
            nodehost.teardown(layout)
            nodehost.prepare_network(layout)
            extra_ips = (layout.host_ip,)
        pki.generate(self.pki, extra_ips=extra_ips)
        self._write_kubeconfigs()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
            self._start_kwok()
            self._create_nodes()
            self._start_podrunner()
            if self.real_node:
                nodehost.start(self)
        except BaseException:
            self.down(keep_logs=True)
            raise
        self.state.started_seconds = round(time.monotonic() - started, 2)
        self._save()
        log.info("testbed up in %.1fs: %s", self.state.started_seconds, self.kubeconfig)
        return self.state

    def _save(self) -> None:
        assert self.state is not None
        self.state_file.write_text(json.dumps(asdict(self.state), indent=2))

    def _launch(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> int:
        """Start a component under a supervisor that restarts it when it exits."""
        assert self.state is not None
        supervised = [sys.executable, "-m", "shoal_testbed.supervise", "--", *argv]
        process = procs.start(
            supervised,
            log_path=self.logs / f"{name}.log",
            env={**(env or os.environ), "PYTHONPATH": _pythonpath()},
            die_with_parent=self.owned_by_caller,
        )
        self.state.pids[name] = process.pid
        self._save()
        return process.pid

    def _wait_healthy(
        self, name: str, url: str, *, context: ssl.SSLContext | None, timeout: float
    ) -> None:
        assert self.state is not None
        pid = self.state.pids[name]
        procs.wait_until(
            lambda: procs.http_ok(url, context=context),
            what=name,
            timeout_seconds=timeout,
            is_alive=lambda: procs.alive(pid),
            log_path=self.logs / f"{name}.log",
        )

    def _start_etcd(self) -> None:
        assert self.state is not None
        client = f"http://127.0.0.1:{self.state.etcd_port}"
        peer = f"http://127.0.0.1:{self.state.etcd_peer_port}"
        self._launch(
            "etcd",
            [
                str(bin_dir() / "etcd"),
                "--name=testbed",
                f"--data-dir={self.dir / 'etcd-data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testbed={peer}",
                # Test data is disposable; fsync only slows every write down.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_healthy("etcd", f"{client}/health", context=None, timeout=60)

    def _start_apiserver(self) -> None:
        assert self.state is not None
        policy = self.pki / "audit-policy.yaml"
        policy.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    # Metadata for everything: who did what to which object, without bodies.
                    "rules": [{"level": "Metadata"}],
                }
            )
        )
        port = self.state.apiserver_port
        self._launch(
            "kube-apiserver",
            _override(
                [
                    str(bin_dir() / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{self.state.etcd_port}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    # A loopback advertise address is refused by the lease endpoint
                    # reconciler; with none, the `kubernetes` Service simply has no endpoints.
                    "--advertise-address=127.0.0.1",
                    "--endpoint-reconciler-type=none",
                    f"--tls-cert-file={self.pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={self.pki / 'apiserver.key'}",
                    f"--client-ca-file={self.pki / 'ca.crt'}",
                    f"--service-account-issuer=https://127.0.0.1:{port}",
                    f"--service-account-key-file={self.pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={self.pki / 'sa.key'}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--authorization-mode=RBAC",
                    "--allow-privileged=true",
                    f"--audit-policy-file={policy}",
                    f"--audit-log-path={self.logs / 'audit.log'}",
                    "--audit-log-maxsize=200",
                    "--audit-log-maxbackup=2",
                    "--profiling=false",
                ],
                self._real_node_apiserver_flags(),
            ),
        )
        self._wait_healthy(
            "kube-apiserver",
            f"{self.state.server}/readyz",
            context=self._client_tls("admin"),
            timeout=120,
        )

    def _real_node_apiserver_flags(self) -> list[str]:
        """With a real node, the API server is also reached from the node's
        namespace (at the host's end of its veth, which the `kubernetes`
        Service's endpoint names), authorizes kubelets as nodes, and talks to
        kubelet (logs, exec) with a client certificate."""
        assert self.state is not None
        if not self.state.real_node:
            return []
        return [
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.state.node_layout().host_ip}",
            "--endpoint-reconciler-type=lease",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={self.pki / 'admin.crt'}",
            f"--kubelet-client-key={self.pki / 'admin.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _secure_component_flags(self, name: str, stem: str, port: int) -> list[str]:
        kubeconfig = self.component_kubeconfig(stem)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / 'certs' / name}",
            "--leader-elect=false",
        ]

    def _start_controller_manager(self) -> None:
        assert self.state is not None
        port = self.state.controller_manager_port
        self._launch(
            "kube-controller-manager",
            [
                str(bin_dir() / "kube-controller-manager"),
                *self._secure_component_flags(
                    "kube-controller-manager", "controller-manager", port
                ),
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--cluster-signing-cert-file={self.pki / 'ca.crt'}",
                f"--cluster-signing-key-file={self.pki / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--controllers=*",
            ],
        )
        self._wait_healthy(
            "kube-controller-manager",
            f"https://127.0.0.1:{port}/healthz",
            context=_insecure_tls(),
            timeout=60,
        )

    def _start_scheduler(self) -> None:
        assert self.state is not None
        port = self.state.scheduler_port
        self._launch(
            "kube-scheduler",
            [
                str(bin_dir() / "kube-scheduler"),
                *self._secure_component_flags("kube-scheduler", "scheduler", port),
            ],
        )
        self._wait_healthy(
            "kube-scheduler",
            f"https://127.0.0.1:{port}/healthz",
            context=_insecure_tls(),
            timeout=60,
        )

    def _start_kwok(self) -> None:
        assert self.state is not None
        octet = self.state.pod_octet
        # kwok serves `kubectl logs` from Logs objects the pod runner writes.
        self.kubectl("apply", "-f", str(HACK / "kwok-logs-crd.yaml"))
        self.wait_crd_established("logs.kwok.x-k8s.io")
        self._launch(
            "kwok",
            [
                str(bin_dir() / "kwok"),
                f"--kubeconfig={self.component_kubeconfig('kwok')}",
                f"--config={HACK / 'kwok-stages.yaml'}",
                f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}=fake",
                # Fallback for a node without a podCIDR; every testbed node has one.
                f"--cidr=127.{octet}.250.0/24",
                "--node-ip=127.0.0.1",
                f"--server-address=127.0.0.1:{self.state.kwok_port}",
                # The kubelet port nodes publish: the API server sends pods/log
                # there (over TLS, not verified without --kubelet-certificate-authority).
                f"--node-port={self.state.kwok_port}",
                "--enable-crds=Logs",
                "--node-lease-duration-seconds=40",
            ],
        )
        self._wait_healthy(
            "kwok", f"http://127.0.0.1:{self.state.kwok_port}/healthz", context=None, timeout=60
        )

    def restart_apiserver(self, *, down_seconds: float = 1.0) -> None:
        """Stop kube-apiserver and start it again on the same port: every
        client's watch breaks, as in an upgrade or a control-plane failover.
        Away past the controllers' renew deadline, kube-controller-manager and
        kube-scheduler start afresh too, as they would under their leader
        election (off here): one left running came back with late informers,
        saw no node heartbeat for node-monitor-grace-period and marked every
        pod NotReady, which no real control plane does after such an outage."""
        assert self.state is not None
        procs.stop_group(self.state.pids["kube-apiserver"], grace_seconds=5)
        controllers = ("kube-controller-manager", "kube-scheduler")
        if down_seconds > CONTROLLERS_RENEW_DEADLINE_SECONDS:
            time.sleep(CONTROLLERS_RENEW_DEADLINE_SECONDS)  # when they would give up
            for name in controllers:
                procs.stop_group(self.state.pids[name], grace_seconds=5)
            time.sleep(down_seconds - CONTROLLERS_RENEW_DEADLINE_SECONDS)
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
        else:
            time.sleep(down_seconds)
            self._start_apiserver()
        self._save()

    def wait_crd_established(self, name: str, *, timeout_seconds: float = 60) -> None:
        """Polled: `kubectl wait --for=condition=Established` fails at once on a
        CRD the API server has not given conditions yet (seen after a restart)."""
        established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        procs.wait_until(
            lambda: self.kubectl("get", f"crd/{name}", "-o", established, check=False) == "True",
            what=f"CRD {name} established",
            timeout_seconds=timeout_seconds,
        )

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None) -> str:
        result = subprocess.run(
            [str(bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input_text,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _create_nodes(self) -> None:
        assert self.state is not None
        manifests = nodes.build_nodes(octet=self.state.pod_octet)
        self.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(manifests))
        names = [m["metadata"]["name"] for m in manifests]
        self.kubectl(
            "wait", "--for=condition=Ready", "--timeout=60s", *(f"node/{n}" for n in names)
        )
        # Pods need the `default` ServiceAccount that kube-controller-manager creates.
        procs.wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", check=False) != "",
            what="the default ServiceAccount",
            timeout_seconds=60,
        )

    def _start_podrunner(self) -> None:
        ready = self.dir / "podrunner.ready"
        ready.unlink(missing_ok=True)
        self._launch(
            "podrunner",
            [
                sys.executable,
                "-m",
                "shoal_testbed.podrunner",
                f"--kubeconfig={self.component_kubeconfig('podrunner')}",
                f"--log-dir={self.logs / 'pods'}",
                f"--ready-file={self.dir / 'podrunner.ready'}",
            ],
            env={**os.environ, "PYTHONPATH": _pythonpath()},
        )
        assert self.state is not None
        pid = self.state.pids["podrunner"]
        procs.wait_until(
            ready.exists,
            what="podrunner",
            timeout_seconds=60,
            is_alive=lambda: procs.alive(pid),
            log_path=self.logs / "podrunner.log",
        )

    def _write_kubeconfigs(self) -> None:
        assert self.state is not None
        for client in pki.CLIENTS:
            config = _kubeconfig(self.state.server, self.pki, client.file_stem)
            self.component_kubeconfig(client.file_stem).write_text(yaml.safe_dump(config))
        shutil.copy(self.component_kubeconfig("admin"), self.kubeconfig)

    # ---- stop
    def down(self, *, keep_logs: bool = True) -> None:
        """Stop every process (last started first) and remove the cluster's data."""
        if self.state is None and self.state_file.exists():
            self.state = State(**json.loads(self.state_file.read_text()))
        if self.state is not None:
            for name, pid in reversed(list(self.state.pids.items())):
                procs.stop_group(pid, grace_seconds=15 if name == "podrunner" else 5)
            if self.state.real_node:
                nodehost.teardown(self.state.node_layout())
        for path in ("etcd-data", "state.json", "podrunner.ready", "certs"):
            target = self.dir / path
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        if not keep_logs:
            shutil.rmtree(self.logs, ignore_errors=True)
        self.state = None


def _kubeconfig(server: str, pki_dir: Path, stem: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "testbed",
                "cluster": {"server": server, "certificate-authority": str(pki_dir / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": stem,
                "user": {
                    "client-certificate": str(pki_dir / f"{stem}.crt"),
                    "client-key": str(pki_dir / f"{stem}.key"),
                },
            }
        ],
        "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": stem}}],
        "current-context": "testbed",
    }


def _override(argv: list[str], flags: list[str]) -> list[str]:
    """argv with each of flags (--name=value) replacing argv's flag of that name."""
    names = {flag.partition("=")[0] for flag in flags}
    return [arg for arg in argv if arg.partition("=")[0] not in names] + flags


def _insecure_tls() -> ssl.SSLContext:
    # Components serve health on self-signed certificates they make at start.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _pythonpath() -> str:
    hack = str(REPO / "hack")
    existing = os.environ.get("PYTHONPATH", "")
    return f"{hack}:{existing}" if existing else hack


def _free_pod_octet() -> int:
    """A second octet of 127.X.0.0/16 that no local socket uses, so two testbeds
    on one machine never hand out the same pod IP."""
    used: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/udp"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                local_hex = line.split()[1].split(":")[0]
                octets = bytes.fromhex(local_hex)[::-1]  # little-endian on x86
                if octets[0] == 127:
                    used.add(octets[1])
    candidates = [o for o in range(100, 250) if o not in used]
    return random.choice(candidates)
