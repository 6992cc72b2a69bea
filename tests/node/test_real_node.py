"""The shoal image on a real kubelet and containerd (the testbed's real node):

- `kubectl get nodes -o wide` shows the node on containerd, with 8 fake GPUs;
- every `shoal` subcommand's --help runs in the image, as user and group
  10001 (not root's group), on a read-only root filesystem;
- `helm install` with the local image runs the operator as a container under
  the chart's ServiceAccount and securityContext (it logs in from there), and
  `helm test` passes; its metrics are scraped through its Service;
- a VLLMCluster with the shoal-engine-sim image reaches READY there, the real
  kubelet holding each engine pod's readiness gate until warm-up admits it;
  requests reach it through the router's ClusterIP Service (kube-proxy), from
  a client pod and from the host;
- a rotated API-key Secret reaches the running routers through kubelet's
  volume update: the old key is refused, the new one accepted, no restart;
- `kubectl logs` and `kubectl exec` work on shoal's pods there;
- a failing liveness probe makes kubelet restart the container;
- clients holding every connection a router allows do not get it restarted
  (kubelet probes its internal port);
- the chart's NetworkPolicies, enforced on the node by kube-router, admit
  everything shoal does (the tests here run with them) and keep any other
  pod off the engines and the routers' internal port;
- an engine that hangs is taken out and its container or pod replaced;
- a rolling restart of the routers loses no request sent through the Service,
  on fresh connections or on one kept alive;
- an engine that exits at start and an image that cannot be pulled show in
  the VLLMCluster's status as the kwok stand-in has them: the reason, the
  engine's last words and the fix, from the real kubelet's statuses;
- an engine pod deleted mid-stream (as a rollout or a node drain stops it)
  finishes the stream before it exits;
- with `operator.replicas: 2` one operator pod acts, holding the Lease; the
  standby passes kubelet's liveness probes while it waits, and takes over
  (and acts) once the acting pod is deleted.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import datetime
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shoal.api.router import INTERNAL_PORT
from shoal.controller.decide import RESTART_GRACE_SECONDS
from shoal.controller.election import RENEW_DEADLINE_SECONDS
from shoal.controller.names import (
    CONDITION_WARMED,
    ROUTER_PORT,
    engine_service_name,
    router_name,
    router_selector,
    selector_text,
)
from shoal_testbed import nodehost, prometheus, realnode
from shoal_testbed.cluster import REPO, Testbed, bin_dir
from tests.e2e.kube import AFTER_API_RESTART_SECONDS, apply, get_json, wait_for
from tests.e2e.operator_env import cluster, cluster_manifest, events, leader_pods

pytestmark = pytest.mark.e2e

IMAGE = "localhost/shoal:dev"
ENGINE_IMAGE = "localhost/shoal-engine-sim:dev"
ON_REAL_NODE = {
    "nodeSelector": {realnode.REAL_NODE_LABEL: "true"},
    "tolerations": [realnode.REAL_NODE_TOLERATION],
}
SUBCOMMANDS = ("operator", "router", "sim", "warmup", "probe", "plan", "crd", "bench", "check")
# The image's user and group (Dockerfile), which the chart does not override.
IMAGE_UID = IMAGE_GID = 10001
MODEL = "m"
KEYS_SECRET, KEYS_KEY = "fleet-api-keys", "keys"


def helm(bed: Testbed, *args: str, timeout: float = 280) -> str:
    result = subprocess.run(
        [str(bin_dir() / "helm"), "--kubeconfig", str(bed.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def pod_on_real_node(name: str, *, command: list[str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            **ON_REAL_NODE,
            "restartPolicy": container.pop("restart_policy", "Never"),
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    # The chart's containers too: the image writes only to /tmp.
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    **container,
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


def phase(bed: Testbed, ns: str, name: str) -> str:
    return str(get_json(bed, "pod", name, "-n", ns).get("status", {}).get("phase", ""))


@pytest.fixture(scope="module")
def apps(node_testbed: Testbed) -> Iterator[str]:
    name = f"node-{uuid.uuid4().hex[:6]}"
    node_testbed.kubectl("create", "namespace", name)
    wait_for(
        lambda: node_testbed.kubectl("get", "serviceaccount", "default", "-n", name, check=False),
        what=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        node_testbed.kubectl("delete", "vllmclusters", "--all", "-n", name, check=False)
        node_testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def shoal_release(node_testbed: Testbed, apps: str) -> Iterator[str]:
    """The chart installed with the local image, the operator on the real node."""
    system = f"shoal-system-{apps.removeprefix('node-')}"
    values = {
        "image": {"repository": IMAGE.rsplit(":", 1)[0], "tag": "dev", "pullPolicy": "Never"},
        "operator": {**ON_REAL_NODE, "watchNamespaces": [apps]},
        # The operator's metrics Service comes with the ServiceMonitor.
        "monitoring": {"serviceMonitor": {"enabled": True}},
        # Enforced on the real node (kube-router): every test here runs with them.
        "networkPolicy": {"enabled": True, "namespaces": [apps]},
    }
    prometheus.install_crds([str(bin_dir() / "kubectl"), f"--kubeconfig={node_testbed.kubeconfig}"])
    values_file = node_testbed.dir / f"values-{system}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm(
        node_testbed,
        "install", "shoal", str(REPO / "charts" / "shoal"),
        "--namespace", system, "--create-namespace",
        "--values", str(values_file), "--wait", "--timeout", "240s",
    )  # fmt: skip
    try:
        yield system
    finally:
        node_testbed.kubectl("delete", "vllmclusters", "--all", "-n", apps, check=False)
        helm(node_testbed, "uninstall", "shoal", "--namespace", system, "--wait")
        node_testbed.kubectl("delete", "namespace", system, "--wait=false", check=False)
        values_file.unlink()


def test_kubectl_get_nodes_shows_the_real_node_on_containerd_with_eight_gpus(
    node_testbed: Testbed,
) -> None:
    wide = node_testbed.kubectl("get", "nodes", "-o", "wide")
    row = next(line for line in wide.splitlines() if line.startswith(realnode.NODE_NAME))
    assert " Ready " in row and "containerd://2." in row, wide
    node = get_json(node_testbed, "node", realnode.NODE_NAME)
    assert node["status"]["allocatable"].get("nvidia.com/gpu") == str(realnode.GPUS)
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == realnode.GPU_PRODUCT
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.36")


def test_every_subcommand_help_runs_in_the_image_as_non_root_on_a_read_only_root(
    node_testbed: Testbed, apps: str
) -> None:
    script = (
        "id -u; id -g; touch /opt/shoal/x 2>/dev/null && echo WRITABLE; shoal --help >/dev/null"
    )
    script += "".join(f" && shoal {c} --help >/dev/null && echo ok-{c}" for c in SUBCOMMANDS)
    help_pod = pod_on_real_node("help", command=["sh", "-c", script])
    lines = _run_to_end(node_testbed, apps, help_pod, timeout=240).split()
    assert lines[:2] == [str(IMAGE_UID), str(IMAGE_GID)] and "WRITABLE" not in lines, lines
    assert [f"ok-{c}" for c in SUBCOMMANDS] == lines[2:], lines


def test_helm_install_runs_the_operator_as_a_container_and_helm_test_passes(
    node_testbed: Testbed, shoal_release: str
) -> None:
    pods = get_json(
        node_testbed, "pods", "-n", shoal_release, "-l", "app.kubernetes.io/component=operator"
    )["items"]
    assert len(pods) == 1, pods
    pod = pods[0]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("containerd://") and status["ready"], status
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["serviceAccountName"].startswith("shoal")
    helm(node_testbed, "test", "shoal", "--namespace", shoal_release, "--timeout", "240s")


def _condition_time(pod: dict[str, Any], kind: str) -> datetime.datetime | None:
    for cond in pod["status"].get("conditions", []):
        if cond["type"] == kind and cond["status"] == "True":
            return datetime.datetime.fromisoformat(cond["lastTransitionTime"])
    return None


def _ready_cluster(bed: Testbed, ns: str, name: str) -> bool:
    status = get_json(bed, "vllmcluster", name, "-n", ns).get("status", {})
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return conditions.get("Ready") == "True"


def on_real_node(name: str, *, router: dict[str, Any] | None = None) -> dict[str, Any]:
    """A one-replica VLLMCluster whose engine and routers run on the real node."""
    manifest = cluster_manifest(
        name,
        replicas=1,
        tensor=1,
        model=MODEL,
        image=ENGINE_IMAGE,
        placement=dict(ON_REAL_NODE),
        router={"pod": dict(ON_REAL_NODE), **(router or {})},
    )
    # The stand-in engine needs little; the defaults (for an H100's vLLM: 4 CPUs
    # and 28Gi) exceed the node, which has the machine's 2 CPUs.
    manifest["spec"]["engine"]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    return manifest


def api_keys_secret(*keys: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": KEYS_SECRET},
        "stringData": {KEYS_KEY: "".join(f"{key}\n" for key in keys)},
    }


@dataclass(frozen=True)
class Fleet:
    """A Ready VLLMCluster on the real node, behind its router's ClusterIP."""

    bed: Testbed
    ns: str
    name: str
    cluster_ip: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.cluster_ip}:{self.port}"

    def key(self) -> str:
        """The key the API-key Secret holds now (a test may rotate it)."""
        secret = get_json(self.bed, "secret", KEYS_SECRET, "-n", self.ns)
        return base64.b64decode(secret["data"][KEYS_KEY]).decode().split()[0]

    def routers(self) -> list[dict[str, Any]]:
        selector = selector_text(router_selector(self.name))
        items: list[dict[str, Any]] = get_json(self.bed, "pods", "-n", self.ns, "-l", selector)[
            "items"
        ]
        return items

    @contextlib.contextmanager
    def from_host(self) -> Iterator[httpx.Client]:
        """A client on the host that reaches the ClusterIP through kube-proxy."""
        assert self.bed.state is not None
        with (
            nodehost.route_to_service(self.bed.state.node_layout(), self.cluster_ip),
            httpx.Client(base_url=self.url, timeout=30) as client,
        ):
            yield client


def complete(client: httpx.Client, prompt: str, *, key: str, fresh: bool = False) -> httpx.Response:
    """`fresh`: on a connection of its own, which kube-proxy may send to
    another router than the last (a kept-alive one stays with its router)."""
    headers = {"Authorization": f"Bearer {key}"}
    if fresh:
        headers["Connection"] = "close"
    return client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 4},
        headers=headers,
    )


@pytest.fixture(scope="module")
def fleet(node_testbed: Testbed, apps: str, shoal_release: str) -> Fleet:
    """One VLLMCluster for the tests that only read it (and the key rotation,
    which leaves it serving), its routers requiring an API key."""
    name = "fleet"
    router = {"apiKeySecret": {"name": KEYS_SECRET, "key": KEYS_KEY}}
    apply(node_testbed, apps, api_keys_secret("key-first"), on_real_node(name, router=router))
    wait_for(lambda: _ready_cluster(node_testbed, apps, name), what=f"{name} Ready", timeout=240)
    service = get_json(node_testbed, "service", router_name(name), "-n", apps)
    return Fleet(
        bed=node_testbed,
        ns=apps,
        name=name,
        cluster_ip=service["spec"]["clusterIP"],
        port=service["spec"]["ports"][0]["port"],
    )


def _run_to_end(bed: Testbed, ns: str, pod: dict[str, Any], *, timeout: float = 180) -> str:
    """Run a pod on the real node to its end; its log (kubectl logs)."""
    name = pod["metadata"]["name"]
    apply(bed, ns, pod)
    wait_for(
        lambda: phase(bed, ns, name) in ("Succeeded", "Failed"),
        what=f"pod {name} to finish",
        timeout=timeout,
    )
    logs = bed.kubectl("logs", name, "-n", ns)
    assert phase(bed, ns, name) == "Succeeded", logs
    return logs


def test_a_vllmcluster_on_the_real_node_is_ready_once_warm_up_lets_kubelet_pass_the_gate(
    fleet: Fleet,
) -> None:
    (leader,) = leader_pods(fleet.bed, fleet.ns, fleet.name)
    assert leader["spec"]["nodeName"] == realnode.NODE_NAME
    assert leader["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    # The real kubelet turned the pod Ready only once shoal set the gate (and
    # its containers were ready). Warmed may come first: shoal's own look at
    # /health can beat kubelet's next readiness probe (seen in CI: 8 s apart).
    warmed = _condition_time(leader, CONDITION_WARMED)
    ready, containers = _condition_time(leader, "Ready"), _condition_time(leader, "ContainersReady")
    assert warmed is not None and ready is not None and containers is not None, leader["status"]
    assert ready >= max(warmed, containers), leader["status"]["conditions"]


def test_requests_reach_the_fleet_through_its_clusterip_service_from_a_pod_and_the_host(
    fleet: Fleet,
) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hello from a pod", "max_tokens": 4})
    script = (
        f"import httpx; r = httpx.post({fleet.url + '/v1/completions'!r}, content={body!r}, "
        f"headers={{'content-type': 'application/json', "
        f"'authorization': 'Bearer {fleet.key()}'}}, timeout=30); "
        "print(r.status_code, r.json()['choices'][0]['text'] != '')"
    )
    client = pod_on_real_node("client", command=["python3", "-c", script])
    assert _run_to_end(fleet.bed, fleet.ns, client, timeout=120).split() == ["200", "True"]

    with fleet.from_host() as host:
        reply = complete(host, "hello from the host", key=fleet.key())
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"], reply.text


# Connects to each (address, port), asks for /health, prints what answered:
# a status code, or "blocked" (refused, or no answer within 5 s).
_REACH = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as c:
            c.settimeout(5)
            c.sendall(b"GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
            print(target, c.recv(64).split(b" ")[1].decode())
    except OSError:
        print(target, "blocked")
"""


def test_network_policies_on_the_real_node_admit_shoals_own_traffic_and_nobody_elses(
    fleet: Fleet,
) -> None:
    # The chart's NetworkPolicies, enforced by kube-router on the real node since
    # before the fleet existed: the fleet got Ready through them (the operator
    # warmed and checked the engine, the routers reached it, kubelet probed
    # both). Any other pod reaches the routers' OpenAI API, not their internal
    # port (where kubelet probes them) and not the engine.
    policies = get_json(fleet.bed, "networkpolicies", "-n", fleet.ns)["items"]
    assert sorted(p["metadata"]["name"] for p in policies) == ["shoal-engines", "shoal-routers"]
    (engine,) = leader_pods(fleet.bed, fleet.ns, fleet.name)
    routers = [p["status"]["podIP"] for p in fleet.routers()]
    assert routers
    expected = {f"{engine['status']['podIP']}:8000": "blocked"}
    for ip in routers:
        expected[f"{ip}:{ROUTER_PORT}"] = "200"
        expected[f"{ip}:{INTERNAL_PORT}"] = "blocked"
    client = pod_on_real_node("outsider", command=["python3", "-c", _REACH, *expected])
    logs = _run_to_end(fleet.bed, fleet.ns, client, timeout=120)
    assert dict(line.split() for line in logs.splitlines()) == expected, logs
    # Nothing kept the fleet from serving through them.
    with fleet.from_host() as host:
        reply = complete(host, "through the policies", key=fleet.key())
    assert reply.status_code == 200, reply.text


def test_a_rotated_api_key_secret_reaches_the_running_routers_without_a_restart(
    fleet: Fleet,
) -> None:
    before = {p["metadata"]["uid"] for p in fleet.routers()}
    old, new = fleet.key(), f"key-{uuid.uuid4().hex[:8]}"
    with fleet.from_host() as host:
        assert complete(host, "old key", key=old).status_code == 200
        assert complete(host, "new key too soon", key=new).status_code == 401
        apply(fleet.bed, fleet.ns, api_keys_secret(new))
        # kubelet rewrites the mounted Secret (syncFrequency 10 s here); the
        # routers re-read it (apiKeyReloadSeconds, 10 s), each on its own
        # clock. Every router behind the Service: answers in a row, each on
        # a fresh connection that kube-proxy spreads (16 in a row all on one
        # of two routers: 1 in 32,768).
        wait_for(
            lambda: all(
                complete(host, "new key", key=new, fresh=True).status_code == 200 for _ in range(16)
            ),
            what="the new key accepted by the routers",
            timeout=150,
        )
        refused = [complete(host, "old key", key=old, fresh=True).status_code for _ in range(8)]
    assert refused == [401] * 8
    after = fleet.routers()
    assert {p["metadata"]["uid"] for p in after} == before
    assert all(c["restartCount"] == 0 for p in after for c in p["status"]["containerStatuses"])


def test_kubectl_logs_and_exec_work_on_shoal_pods_on_the_real_node(fleet: Fleet) -> None:
    (leader,) = leader_pods(fleet.bed, fleet.ns, fleet.name)
    router = fleet.routers()[0]
    assert router["spec"]["nodeName"] == realnode.NODE_NAME
    for pod in (leader, router):
        name = pod["metadata"]["name"]
        identity = fleet.bed.kubectl("exec", "-n", fleet.ns, name, "--", "id")
        assert identity.startswith(f"uid={IMAGE_UID}(shoal) gid={IMAGE_GID}(shoal)"), identity
        assert fleet.bed.kubectl("exec", "-n", fleet.ns, name, "--", "shoal", "--version").strip()
    # Each container's own log, from kubelet through the API server.
    engine_log = fleet.bed.kubectl("logs", "-n", fleet.ns, leader["metadata"]["name"])
    assert "engine ready at" in engine_log, engine_log[-2000:]
    router_log = fleet.bed.kubectl("logs", "-n", fleet.ns, router["metadata"]["name"])
    assert "router listening on" in router_log, router_log[-2000:]


def test_the_operators_metrics_are_scraped_through_its_service(
    fleet: Fleet, shoal_release: str
) -> None:
    service = get_json(fleet.bed, "service", "shoal-metrics", "-n", shoal_release)
    cluster_ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    assert fleet.bed.state is not None
    with nodehost.route_to_service(fleet.bed.state.node_layout(), cluster_ip):
        metrics = httpx.get(f"http://{cluster_ip}:{port}/metrics", timeout=10).text
    passes = [
        sample
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "shoal_operator_reconcile_passes_total"
        and sample.labels == {"namespace": fleet.ns, "vllmcluster": fleet.name, "result": "ok"}
    ]
    assert passes and passes[0].value >= 1, metrics


def test_a_failing_liveness_probe_makes_kubelet_restart_the_container(
    node_testbed: Testbed, apps: str
) -> None:
    probe = {"exec": {"command": ["false"]}, "periodSeconds": 2, "failureThreshold": 1}
    pod = pod_on_real_node(
        "liveness", command=["sleep", "600"], livenessProbe=probe, restart_policy="Always"
    )
    apply(node_testbed, apps, pod)
    wait_for(
        lambda: (
            get_json(node_testbed, "pod", "liveness", "-n", apps)
            .get("status", {})
            .get("containerStatuses", [{}])[0]
            .get("restartCount", 0)
            >= 1
        ),
        what="kubelet to restart the container",
        timeout=120,
    )
    events = node_testbed.kubectl(
        "get", "events", "-n", apps, "--field-selector", "involvedObject.name=liveness"
    )
    assert "Unhealthy" in events and "Liveness probe failed" in events, events


def _refused_at_once(connection: socket.socket) -> bool:
    """Whether the router answered a connection 503 before it asked anything
    (it does so beyond its bound); False when it waits for a request."""
    connection.settimeout(1)
    try:
        answer = connection.recv(65536)
    except TimeoutError:
        connection.settimeout(10)
        return False
    assert answer.startswith(b"HTTP/1.1 503"), answer
    return True


def test_clients_holding_every_router_connection_do_not_get_it_restarted(
    node_testbed: Testbed, apps: str, shoal_release: str
) -> None:
    # Kept-alive client pools fill the router's connection bound with no load at
    # all. kubelet probed the client port, got 503 there, and restarted the
    # router serving every one of those clients.
    name = "crowded"
    router = {"replicas": 1, "maxClientConnections": 4}
    apply(node_testbed, apps, on_real_node(name, router=router))
    wait_for(lambda: _ready_cluster(node_testbed, apps, name), what=f"{name} Ready", timeout=240)
    service = get_json(node_testbed, "service", router_name(name), "-n", apps)
    address = (service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"])
    selector = selector_text(router_selector(name))

    def router_pod() -> dict[str, Any]:
        (pod,) = get_json(node_testbed, "pods", "-n", apps, "-l", selector)["items"]
        return dict(pod)

    uid = router_pod()["metadata"]["uid"]
    assert node_testbed.state is not None
    with (
        nodehost.route_to_service(node_testbed.state.node_layout(), address[0]),
        contextlib.ExitStack() as held,
    ):
        # Up to the bound (Prometheus keeps a connection of its own), then one more.
        for _ in range(5):
            pooled = held.enter_context(socket.create_connection(address, timeout=10))
            if _refused_at_once(pooled):
                break
            pooled.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert pooled.recv(65536).startswith(b"HTTP/1.1 200")  # then idle, kept alive
        else:
            raise AssertionError("the router took 5 connections with a bound of 4")
        # Liveness gives up after 3 failures 5 s apart; wait past that.
        time.sleep(25)
        pod = router_pod()
        (status,) = pod["status"]["containerStatuses"]
    assert pod["metadata"]["uid"] == uid and status["restartCount"] == 0, status
    assert status["ready"], pod["status"]
    node_testbed.kubectl("delete", "vllmcluster", name, "-n", apps, "--wait=false")


def test_an_engine_that_hangs_is_restarted_on_the_real_node(
    node_testbed: Testbed, apps: str, shoal_release: str
) -> None:
    # Hangs 40 s (2000 simulated seconds at 50x) after it starts: warm, then stuck.
    manifest = on_real_node("hung")
    manifest["spec"]["engine"]["extraArgs"] += ["--sim-hang-after", "2000"]
    apply(node_testbed, apps, manifest)
    (first,) = wait_for(
        lambda: [p for p in leader_pods(node_testbed, apps, "hung") if p["status"].get(
            "containerStatuses", [{}])[0].get("started")],
        what="the engine container started",
        timeout=180,
    )  # fmt: skip
    uid = first["metadata"]["uid"]

    def restarted() -> bool:
        pods = leader_pods(node_testbed, apps, "hung")
        return any(
            p["metadata"]["uid"] != uid
            or p["status"].get("containerStatuses", [{}])[0].get("restartCount", 0) >= 1
            for p in pods
        )

    wait_for(restarted, what="the hung engine's container or pod replaced", timeout=200)


def _send_until(
    fleet: Fleet, done: threading.Event, *, fresh: bool, pause: float = 0.0
) -> tuple[int, list[str]]:
    """Requests through the Service until `done`, each on a fresh connection
    (kube-proxy picks a router for each) or all on one kept alive: how many
    were sent, and what went wrong."""
    failures: list[str] = []
    sent = 0
    key = fleet.key()
    with fleet.from_host() as host:
        while not done.is_set():
            sent += 1
            try:
                reply = complete(host, f"roll {sent}", key=key, fresh=fresh)
            except httpx.HTTPError as error:
                failures.append(f"{type(error).__name__}: {error}")
                continue
            if reply.status_code != 200:
                failures.append(f"{reply.status_code}: {reply.text[:200]}")
            time.sleep(pause)
    return sent, failures


@contextlib.contextmanager
def _clients(
    fleet: Fleet, *kinds: tuple[bool, float]
) -> Iterator[Callable[[], list[tuple[int, list[str]]]]]:
    """Clients (fresh connections or not, pause between requests) sending
    through the Service from now on; the function given stops them and gives
    what each sent and saw fail. Stopped too when the block fails, so that
    its error is not lost to clients sending for ever."""
    done = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
        clients = [
            pool.submit(_send_until, fleet, done, fresh=fresh, pause=pause)
            for fresh, pause in kinds
        ]

        def finish() -> list[tuple[int, list[str]]]:
            done.set()
            return [client.result() for client in clients]

        try:
            yield finish
        finally:
            done.set()


def test_a_rolling_restart_of_the_routers_loses_no_request(fleet: Fleet) -> None:
    # kube-proxy sends new connections to a terminating router until its
    # endpoint is gone from the node's rules: a router that stops listening
    # at once refuses them, and one that closes a kept-alive connection as a
    # request arrives on it loses that request (both seen before the routers
    # got a preStop delay and a drain that moves kept-alive clients off).
    # One client leaves gaps, so an old router may be idle when told to stop.
    before = {p["metadata"]["uid"] for p in fleet.routers()}
    with _clients(fleet, (True, 0.0), (False, 0.0), (True, 0.05)) as finish:
        time.sleep(2)
        deployment = f"deployment/{router_name(fleet.name)}"
        fleet.bed.kubectl("rollout", "restart", deployment, "-n", fleet.ns)
        fleet.bed.kubectl("rollout", "status", deployment, "-n", fleet.ns, "--timeout=240s")
        # Until the old routers are gone: they drain what they still serve.
        wait_for(
            lambda: not {p["metadata"]["uid"] for p in fleet.routers()} & before,
            what="the old routers gone",
            timeout=120,
        )
        outcomes = finish()
    told = [(sent, len(failures), sorted(set(failures))) for sent, failures in outcomes]
    assert all(sent >= 20 and not failures for sent, failures in outcomes), told


def _degraded_with(bed: Testbed, ns: str, name: str, reason: str) -> dict[str, Any]:
    """The cluster's Degraded condition once it is True with `reason`."""

    def found() -> dict[str, Any] | None:
        for condition in cluster(bed, ns, name).get("status", {}).get("conditions", []):
            if condition["type"] == "Degraded" and condition["reason"] == reason:
                return dict(condition)
        return None

    degraded: dict[str, Any] = wait_for(found, what=f"{name} Degraded: {reason}", timeout=180)
    assert degraded["status"] == "True", degraded
    warnings = [e["reason"] for e in events(bed, ns, name) if e["type"] == "Warning"]
    assert reason in warnings, warnings
    return degraded


def test_a_crash_looping_engine_and_an_image_that_cannot_be_pulled_say_why_on_the_real_node(
    node_testbed: Testbed, apps: str, shoal_release: str
) -> None:
    # What the testbed's kwok stand-in reports of failing containers was
    # modelled on kubelet's; here a real kubelet and containerd report them:
    # an engine that exits at start (100 KV blocks hold fewer tokens than
    # maxModelLen, as vLLM refuses) and an image no registry serves.
    crash = on_real_node("crash")
    crash["spec"]["engine"]["extraArgs"] += ["--num-gpu-blocks-override", "100"]
    missing = f"{ENGINE_IMAGE.rsplit(':', 1)[0]}:missing"
    nopull = on_real_node("nopull")
    nopull["spec"]["image"] = missing
    apply(node_testbed, apps, crash, nopull)

    _degraded_with(node_testbed, apps, "crash", "EngineCrashLooping")
    # Its cause, read from the run's log: kubelet's 2 KB tail holds only the
    # API server's traceback that follows it. Read a moment after the run
    # ended, kubelet served that log empty (seen): it is read again.
    cause = 'saying "ValueError: To serve at least one request'

    def told() -> str | None:
        said = str(_degraded_with(node_testbed, apps, "crash", "EngineCrashLooping")["message"])
        return said if cause in said else None

    message = wait_for(told, what="the engine's cause in Degraded", timeout=120)
    assert "the engine of pod crash-r0-0 exits with code 1" in message, message
    # The engine's last words, through kubelet's FallbackToLogsOnError, and the fix.
    assert "the KV cache cannot hold spec.engine.maxModelLen tokens" in message, message
    assert "see kubectl logs crash-r0-0 --previous" in message, message

    def previous_logs() -> str | None:
        # kubelet keeps one dead container per pod, so as the loop goes on the
        # one `--previous` names may be removed as kubectl asks for it (seen:
        # "unable to retrieve container logs for containerd://...").
        logs = node_testbed.kubectl("logs", "crash-r0-0", "-n", apps, "--previous", check=False)
        return logs if "max seq len" in logs else None

    wait_for(previous_logs, what="the crashed engine's last words in kubectl logs", timeout=60)
    entry = cluster(node_testbed, apps, "crash")["status"]["replicaStatuses"][0]
    assert entry["state"] == "CrashLooping", entry
    assert entry["lastTermination"] == "pod crash-r0-0: exit code 1 (Error)", entry

    message = _degraded_with(node_testbed, apps, "nopull", "ImagePullFailing")["message"]
    assert f"image {missing} cannot be pulled" in message, message
    described = node_testbed.kubectl("describe", "vlc", "nopull", "-n", apps)
    assert "ImagePullFailing" in described and "check spec.image" in described, described
    node_testbed.kubectl("delete", "vllmcluster", "crash", "nopull", "-n", apps, "--wait=false")


def _deleted_at(bed: Testbed, ns: str, pod: dict[str, Any], seen: list[float]) -> None:
    """Appends when the pod is first seen terminating (or gone)."""
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = get_json(bed, "pods", "-n", ns, "--field-selector", f"metadata.name={name}")
        now = [p for p in found["items"] if p["metadata"]["uid"] == uid]
        if not now or now[0]["metadata"].get("deletionTimestamp"):
            seen.append(time.monotonic())
            return
        time.sleep(0.2)


@pytest.mark.parametrize("stopped_by", ["kubectl delete", "a rollout"])
def test_an_engine_pod_deleted_mid_stream_finishes_the_stream(
    node_testbed: Testbed, apps: str, shoal_release: str, stopped_by: str
) -> None:
    # What a node drain or a rollout does to an engine: its pod is deleted
    # and kubelet stops it. vLLM's default aborts every request it runs; with
    # --shutdown-timeout (spec.engine.shutdownTimeoutSeconds) they run to
    # their end, the routers having dropped the terminating pod for new ones.
    # A rollout's deletion is the operator's (OnDelete StatefulSets): it gave
    # every pod a restart's 5 s grace, which cut the stream.
    name = "drained" if stopped_by == "kubectl delete" else "rolled"
    manifest = on_real_node(name)
    # Slow enough that the stream outlasts the pod's deletion by more than a
    # restart's grace (5 s): about 15 s for its 1,500 tokens.
    manifest["spec"]["engine"]["extraArgs"] = ["--sim-time-scale", "0.5"]
    apply(node_testbed, apps, manifest)
    wait_for(lambda: _ready_cluster(node_testbed, apps, name), what=f"{name} Ready", timeout=240)
    service = get_json(node_testbed, "service", router_name(name), "-n", apps)
    cluster_ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    (leader,) = leader_pods(node_testbed, apps, name)
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 1500, "stream": True}
    body["ignore_eos"] = True
    lines: list[str] = []
    deleted: list[float] = []
    watch = threading.Thread(target=_deleted_at, args=(node_testbed, apps, leader, deleted))
    assert node_testbed.state is not None
    with (
        nodehost.route_to_service(node_testbed.state.node_layout(), cluster_ip),
        httpx.stream(
            "POST", f"http://{cluster_ip}:{port}/v1/completions", json=body, timeout=120
        ) as answer,
    ):
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line and not lines:
                watch.start()
                if stopped_by == "kubectl delete":
                    node_testbed.kubectl(
                        "delete", "pod", leader["metadata"]["name"], "-n", apps, "--wait=false"
                    )
                else:  # a new template: the operator replaces the pod
                    roll = {"spec": {"engine": {"env": [{"name": "ROLLED", "value": "1"}]}}}
                    node_testbed.kubectl(
                        "patch", "vlc", name, "-n", apps, "--type=merge", "-p", json.dumps(roll)
                    )
            if line:
                lines.append(line)
    ended = time.monotonic()
    watch.join()
    assert deleted, "the pod was never deleted"
    ran_on = ended - deleted[0]
    assert lines[-1] == "data: [DONE]", (ran_on, lines[-3:])
    last = json.loads(lines[-2].removeprefix("data: "))
    assert "error" not in last, f"the stream broke {ran_on:.1f} s after the deletion: {last}"
    assert last["choices"][0]["finish_reason"] == "length", last
    assert len(lines) == 1500 + 1, len(lines)
    # Past a restart's grace: the pod drained for its own grace period.
    assert ran_on > RESTART_GRACE_SECONDS + 1, f"the stream ended {ran_on:.1f} s after the deletion"
    node_testbed.kubectl("delete", "vllmcluster", name, "-n", apps, "--wait=false")


# kubelet restarts a container after initialDelaySeconds plus failureThreshold
# failed liveness probes periodSeconds apart (the chart's: 10 + 3 x 20 s).
LIVENESS_WINDOW_SECONDS = 70


def _operator_pods(bed: Testbed, system: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component=operator"
    pods: list[dict[str, Any]] = get_json(bed, "pods", "-n", system, "-l", selector)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _lease_holder(bed: Testbed, system: str) -> str:
    lease = get_json(bed, "lease", "shoal", "-n", system)
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def _acts(fleet: Fleet) -> None:
    """An operator acts on the fleet: a child deleted by hand comes back."""
    engines = engine_service_name(fleet.name)
    fleet.bed.kubectl("delete", "service", engines, "-n", fleet.ns)
    wait_for(
        lambda: fleet.bed.kubectl("get", "service", engines, "-n", fleet.ns, check=False),
        what=f"Service {engines} made again by the operator holding the Lease",
        timeout=60,
    )


def _restarts(pods: list[dict[str, Any]]) -> dict[str, int]:
    """Each pod's container restarts, by pod UID."""
    return {
        p["metadata"]["uid"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"])
        for p in pods
    }


def test_the_control_plane_away_past_the_renew_deadline_stops_nothing_that_serves(
    fleet: Fleet, shoal_release: str
) -> None:
    # A control-plane upgrade or failover outlasting the Lease's renew
    # deadline: the operator cannot renew, so it exits for kubelet to restart
    # it, and it acts again once the API server is back. The routers serve
    # from what they last saw all along; no engine or router is replaced.
    bed = fleet.bed
    holder = _lease_holder(bed, shoal_release)
    assert holder, "no operator holds the Lease"
    serving = leader_pods(bed, fleet.ns, fleet.name) + fleet.routers()
    before = _restarts(serving)
    (operator,) = _operator_pods(bed, shoal_release)
    with _clients(fleet, (True, 0.05), (False, 0.05)) as finish:
        time.sleep(2)
        bed.restart_apiserver(down_seconds=RENEW_DEADLINE_SECONDS + 10)

        def new_holder() -> str | None:
            held = _lease_holder(bed, shoal_release)
            return held if held and held != holder else None

        taken_by = wait_for(
            new_holder,
            what="the Lease held again, by the restarted operator",
            timeout=AFTER_API_RESTART_SECONDS,
        )
        outcomes = finish()
    told = [(sent, len(failures), sorted(set(failures))) for sent, failures in outcomes]
    assert all(sent >= 20 and not failures for sent, failures in outcomes), told
    (restarted,) = _operator_pods(bed, shoal_release)
    assert restarted["metadata"]["uid"] == operator["metadata"]["uid"], "the pod was replaced"
    assert taken_by.startswith(f"{operator['metadata']['name']}_"), taken_by
    last = restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 1, last
    after = _restarts(leader_pods(bed, fleet.ns, fleet.name) + fleet.routers())
    assert after == before, (before, after)
    _acts(fleet)


def test_a_standby_operator_lives_beside_the_acting_one_and_takes_over_when_its_pod_goes(
    fleet: Fleet, shoal_release: str
) -> None:
    bed = fleet.bed
    helm(
        bed,
        "upgrade", "shoal", str(REPO / "charts" / "shoal"), "--namespace", shoal_release,
        "--reuse-values", "--set", "operator.replicas=2", "--wait", "--timeout", "240s",
    )  # fmt: skip
    wait_for(
        lambda: len(_operator_pods(bed, shoal_release)) == 2 and _lease_holder(bed, shoal_release),
        what="two operator pods, one holding the Lease",
    )
    holder = _lease_holder(bed, shoal_release)
    pods = {p["metadata"]["name"]: p for p in _operator_pods(bed, shoal_release)}
    acting = next(name for name in pods if holder.startswith(f"{name}_"))
    (standby,) = set(pods) - {acting}
    # The standby answers the real kubelet's liveness probes while it waits.
    started = datetime.datetime.fromisoformat(pods[standby]["status"]["startTime"])
    alive_for = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    time.sleep(max(0.0, LIVENESS_WINDOW_SECONDS + 10 - alive_for))
    status = get_json(bed, "pod", standby, "-n", shoal_release)["status"]
    assert status["containerStatuses"][0]["restartCount"] == 0, status
    # Each probe kubelet counts as failed is an Unhealthy Event.
    failed = [e["message"] for e in events(bed, shoal_release, standby)]
    assert not [m for m in failed if "Liveness probe failed" in m], failed
    assert _lease_holder(bed, shoal_release) == holder

    # The acting pod deleted (a drain, say): it releases the Lease as it stops,
    # and a waiting operator takes it: the standby, or the pod replacing the
    # deleted one if it asks first.
    bed.kubectl("delete", "pod", acting, "-n", shoal_release, "--wait=false")

    def successor() -> str | None:
        held = _lease_holder(bed, shoal_release)
        return held if held and not held.startswith(f"{acting}_") else None

    taken_by = wait_for(
        successor,
        what="another operator holding the Lease",
        timeout=60,
    )
    live = {p["metadata"]["name"] for p in _operator_pods(bed, shoal_release)} - {acting}
    assert standby in live and any(taken_by.startswith(f"{name}_") for name in live), (
        taken_by,
        live,
    )
    _acts(fleet)
