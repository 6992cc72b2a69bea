"""The testbed is a real control plane: scheduling of extended resources,
readiness gates, garbage collection, the pod runner, local pod IPs, and
versions of kubectl and helm."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from shoal_testbed import realnode
from shoal_testbed.cluster import Testbed, bin_dir, pins
from shoal_testbed.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TAINT
from tests.e2e.kube import (
    AFTER_API_RESTART_SECONDS,
    apply,
    condition,
    get_json,
    namespace,
    pod_if,
    pods,
    run_pod,
    wait_for,
)

pytestmark = pytest.mark.e2e

H100 = "NVIDIA-H100-80GB-HBM3"
WARMED = "serving.shoal.dev/warmed"


def gpu_statefulset(name: str, *, replicas: int, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {GPU_PRODUCT_LABEL: H100},
                    "tolerations": [
                        {"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def test_gpu_statefulset_fills_gpu_nodes_with_room_and_no_more(testbed: Testbed) -> None:
    nodes = {n["metadata"]["name"]: n for n in get_json(testbed, "nodes")["items"]}
    # Not the real node, when it is up: only pods that tolerate its taint go there.
    h100 = {
        name
        for name, n in nodes.items()
        if n["metadata"]["labels"].get(GPU_PRODUCT_LABEL) == H100 and name != realnode.NODE_NAME
    }
    capacity = sum(int(nodes[name]["status"]["allocatable"][GPU_RESOURCE]) for name in h100)
    fits = capacity // 4
    with namespace(testbed, "gpu") as ns:
        apply(testbed, ns, gpu_statefulset("tp4", replicas=fits, gpus=4))

        def all_ready() -> list[dict[str, Any]] | None:
            found = pods(testbed, ns, "app=tp4")
            ready = [p for p in found if condition(p, "Ready") == "True"]
            return found if len(ready) == fits else None

        placed = wait_for(all_ready, what=f"{fits} Ready pods of 4 GPUs", timeout=90)
        used: dict[str, int] = {}
        for pod in placed:
            assert pod["status"]["phase"] == "Running"
            node = pod["spec"]["nodeName"]
            assert node in h100, f"{pod['metadata']['name']} landed on {node}, not an H100 node"
            used[node] = used.get(node, 0) + 4
        assert all(count <= 8 for count in used.values()), used

        # One more replica has no node with 4 free GPUs left: it must stay Pending.
        testbed.kubectl("scale", "statefulset/tp4", f"--replicas={fits + 1}", "-n", ns)
        extra = f"tp4-{fits}"
        message = wait_for(
            lambda: _scheduling_failure(testbed, ns, extra),
            what=f"FailedScheduling for {extra}",
            timeout=60,
        )
        assert f"Insufficient {GPU_RESOURCE}" in message
        pod = get_json(testbed, "pod", extra, "-n", ns)
        assert pod["status"]["phase"] == "Pending"
        assert not pod["spec"].get("nodeName")


def test_pod_wanting_more_gpus_than_any_node_stays_pending(testbed: Testbed) -> None:
    with namespace(testbed, "toobig") as ns:
        apply(testbed, ns, gpu_statefulset("tp16", replicas=1, gpus=16))
        message = wait_for(
            lambda: _scheduling_failure(testbed, ns, "tp16-0"),
            what="FailedScheduling for tp16-0",
            timeout=60,
        )
        assert f"Insufficient {GPU_RESOURCE}" in message
        assert get_json(testbed, "pod", "tp16-0", "-n", ns)["status"]["phase"] == "Pending"


def _scheduling_failure(bed: Testbed, ns: str, pod: str) -> str | None:
    events = get_json(
        bed,
        "events",
        "-n",
        ns,
        "--field-selector",
        f"involvedObject.name={pod},reason=FailedScheduling",
    )
    messages = [e.get("message", "") for e in events["items"]]
    return "\n".join(messages) or None


def gated_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "readinessGates": [{"conditionType": WARMED}],
            "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.32.0"}],
        },
    }


def _set_gate(bed: Testbed, ns: str, pod: str, status: str) -> None:
    patch = f'{{"status":{{"conditions":[{{"type":"{WARMED}","status":"{status}"}}]}}}}'
    bed.kubectl(
        "patch", "pod", pod, "-n", ns, "--subresource=status", "--type=strategic", "-p", patch
    )


def test_readiness_gate_holds_pod_not_ready_until_condition_true(testbed: Testbed) -> None:
    with namespace(testbed, "gate") as ns:
        apply(testbed, ns, gated_pod("gated"))
        running = wait_for(
            lambda: pod_if(testbed, ns, "gated", lambda p: p["status"].get("phase") == "Running"),
            what="gated pod Running",
        )
        assert condition(running, "Ready") == "False"
        assert condition(running, "ContainersReady") == "True"
        # kwok's stages run on every change: touch the pod and make sure it stays not-Ready.
        testbed.kubectl("label", "pod", "gated", "-n", ns, "touched=yes")
        _set_gate(testbed, ns, "gated", "False")
        for _ in range(8):
            assert condition(get_json(testbed, "pod", "gated", "-n", ns), "Ready") == "False"
            time.sleep(0.25)

        _set_gate(testbed, ns, "gated", "True")
        wait_for(
            lambda: condition(get_json(testbed, "pod", "gated", "-n", ns), "Ready") == "True",
            what="Ready=True after the gate is True",
            timeout=30,
        )

        _set_gate(testbed, ns, "gated", "False")
        pod = wait_for(
            lambda: pod_if(testbed, ns, "gated", lambda p: condition(p, "Ready") == "False"),
            what="Ready=False after the gate is False",
            timeout=30,
        )
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "ReadinessGatesNotReady"
        assert WARMED in ready["message"]


def test_deleting_an_owner_garbage_collects_its_children(testbed: Testbed) -> None:
    with namespace(testbed, "gc") as ns:
        labels = {"app": "web"}
        apply(
            testbed,
            ns,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
                    },
                },
            },
        )
        wait_for(lambda: len(pods(testbed, ns, "app=web")) == 2, what="2 pods of the Deployment")
        replicasets = get_json(testbed, "replicasets", "-n", ns)["items"]
        assert len(replicasets) == 1
        owner = replicasets[0]["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Deployment", "web")

        testbed.kubectl("delete", "deployment", "web", "-n", ns, "--wait=false")
        wait_for(
            lambda: (
                not get_json(testbed, "replicasets", "-n", ns)["items"]
                and not pods(testbed, ns, "app=web")
            ),
            what="ReplicaSet and pods garbage-collected",
            timeout=60,
        )


# A server that answers with its pod's UID, so a test can tell processes apart.
UID_SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = os.environ['MY_UID'].encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "http.server.ThreadingHTTPServer((os.environ['MY_IP'], int(os.environ['PORT'])), H)"
    ".serve_forever()\n"
)


def runner_statefulset() -> dict[str, Any]:
    labels = {"app": "echo"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "echo"},
        "spec": {
            "replicas": 1,
            "serviceName": "echo",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"testbed.shoal.dev/run": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "web",
                            "image": "python:3.11",
                            "command": ["python3", "-c", UID_SERVER],
                            "env": [
                                {"name": "PORT", "value": "8080"},
                                {
                                    "name": "MY_IP",
                                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                },
                                {
                                    "name": "MY_UID",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                                },
                            ],
                        }
                    ],
                },
            },
        },
    }


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def test_pod_runner_runs_a_process_per_pod_uid(testbed: Testbed) -> None:
    with namespace(testbed, "runner") as ns:
        apply(testbed, ns, runner_statefulset())
        first = wait_for(
            lambda: (p := pods(testbed, ns, "app=echo")) and p[0]["status"].get("podIP") and p[0],
            what="echo-0 with a pod IP",
        )
        url = f"http://{first['status']['podIP']}:8080/"
        answer = wait_for(lambda: _fetch(url), what=f"the process at {url}", timeout=30)
        assert answer == first["metadata"]["uid"]

        testbed.kubectl("delete", "pod", "echo-0", "-n", ns, "--wait=true")
        # The StatefulSet makes a replacement with the same name and a new UID.
        second = wait_for(
            lambda: next(
                (
                    p
                    for p in pods(testbed, ns, "app=echo")
                    if p["metadata"]["uid"] != first["metadata"]["uid"] and p["status"].get("podIP")
                ),
                None,
            ),
            what="replacement pod with a pod IP",
        )
        url2 = f"http://{second['status']['podIP']}:8080/"
        answer2 = wait_for(lambda: _fetch(url2), what=f"the new process at {url2}", timeout=30)
        assert answer2 == second["metadata"]["uid"]
        if url2 != url:
            assert _fetch(url) is None, "the deleted pod's process still answers"

        testbed.kubectl("delete", "statefulset", "echo", "-n", ns, "--wait=true")
        wait_for(lambda: not pods(testbed, ns, "app=echo"), what="echo pods gone")
        wait_for(lambda: _fetch(url2) is None, what="the process to stop with its pod", timeout=30)


def test_every_pod_ip_is_local_and_bindable(testbed: Testbed) -> None:
    with namespace(testbed, "ips") as ns:
        apply(testbed, ns, gated_pod("a"), gated_pod("b"))
        wait_for(
            lambda: all(
                p["status"].get("podIP") for p in get_json(testbed, "pods", "-n", ns)["items"]
            ),
            what="pod IPs in the namespace",
        )
        addresses = {
            p["status"]["podIP"]
            for p in get_json(testbed, "pods", "-A")["items"]
            if p["status"].get("podIP")
        }
        assert len(addresses) >= 2
        for address in addresses:
            assert ipaddress.ip_address(address).is_loopback, address
            with socket.socket() as sock:
                sock.bind((address, 0))


def test_kubectl_and_helm_report_the_pinned_versions(testbed: Testbed) -> None:
    versions = pins()
    reported = json.loads(testbed.kubectl("version", "-o", "json"))
    assert reported["clientVersion"]["gitVersion"] == versions["KUBERNETES_VERSION"]
    assert reported["serverVersion"]["gitVersion"] == versions["KUBERNETES_VERSION"]
    helm = subprocess.run(
        [str(bin_dir() / "helm"), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert (
        helm.stdout.startswith(versions["HELM_VERSION"] + "+")
        or helm.stdout.strip() == versions["HELM_VERSION"]
    ), helm.stdout


def _container_status(bed: Testbed, ns: str, pod: str) -> dict[str, Any]:
    found = get_json(bed, "pod", pod, "-n", ns)["status"].get("containerStatuses") or [{}]
    status: dict[str, Any] = found[0]
    return status


def _waiting(bed: Testbed, ns: str, pod: str, *reasons: str) -> dict[str, Any] | None:
    status = _container_status(bed, ns, pod)
    reason = status.get("state", {}).get("waiting", {}).get("reason")
    return status if reason in reasons else None


def test_a_crashing_container_shows_crash_loop_back_off_its_exit_code_and_log(
    testbed: Testbed,
) -> None:
    script = "import sys; print('engine: bad flag --bogus', flush=True); sys.exit(3)"
    with namespace(testbed, "crash") as ns:
        apply(
            testbed,
            ns,
            run_pod("crash", script, terminationMessagePolicy="FallbackToLogsOnError"),
        )
        status = wait_for(
            lambda: _waiting(testbed, ns, "crash", "CrashLoopBackOff"),
            what="crash in CrashLoopBackOff",
            timeout=60,
        )
        last = status["lastState"]["terminated"]
        assert (last["exitCode"], last["reason"]) == (3, "Error")
        assert "bad flag --bogus" in last["message"]
        assert "back-off 10s" in status["state"]["waiting"]["message"]
        # kubelet's first backoff is 10 s: the restart comes, and is counted.
        wait_for(
            lambda: _container_status(testbed, ns, "crash").get("restartCount", 0) >= 1,
            what="crash restarted once",
            timeout=30,
        )
        columns = testbed.kubectl("get", "pod", "crash", "-n", ns).splitlines()[1].split()
        assert columns[2] in ("CrashLoopBackOff", "Error", "Running"), columns


def test_an_unpullable_image_shows_image_pull_back_off(testbed: Testbed) -> None:
    with namespace(testbed, "pull") as ns:
        pod = gated_pod("nopull")
        pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:doesnotexist"
        apply(testbed, ns, pod)
        status = wait_for(
            lambda: _waiting(testbed, ns, "nopull", "ImagePullBackOff"),
            what="nopull in ImagePullBackOff",
            timeout=60,
        )
        assert "vllm/vllm-openai:doesnotexist" in status["state"]["waiting"]["message"]
        assert status["restartCount"] == 0


def test_a_missing_secret_key_is_a_config_error_until_the_secret_exists(
    testbed: Testbed,
) -> None:
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    script = "import os, time; print('token', os.environ['TOKEN'], flush=True); time.sleep(600)"
    with namespace(testbed, "config") as ns:
        apply(testbed, ns, run_pod("needs", script, env=env))
        status = wait_for(
            lambda: _waiting(testbed, ns, "needs", "CreateContainerConfigError"),
            what="needs in CreateContainerConfigError",
            timeout=60,
        )
        assert status["state"]["waiting"]["message"] == 'Error: secret "hf" not found'
        testbed.kubectl("create", "secret", "generic", "hf", "-n", ns, "--from-literal=token=t0k")
        wait_for(
            lambda: "running" in _container_status(testbed, ns, "needs").get("state", {}),
            what="needs running once its Secret exists",
            timeout=30,
        )


def _sim_with_a_volume(name: str) -> list[dict[str, Any]]:
    """A shoal-image pod (the runner refreshes its ConfigMap volume while it
    runs, as kubelet does) serving `shoal sim` on its pod IP."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name},
            "data": {"note": "x"},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "conf", "configMap": {"name": name}}],
                "containers": [
                    {
                        "name": "sim",
                        "image": "shoal:0.1.0",
                        "args": ["sim", "--host", "0.0.0.0", "--port", "8080"],
                        "volumeMounts": [{"name": "conf", "mountPath": "/etc/conf"}],
                    }
                ],
            },
        },
    ]


def test_the_pod_runner_keeps_its_processes_through_an_api_server_restart(
    testbed: Testbed,
) -> None:
    with namespace(testbed, "apirestart") as ns:
        apply(testbed, ns, *_sim_with_a_volume("vol"))
        pod = wait_for(
            lambda: pod_if(testbed, ns, "vol", lambda p: bool(p["status"].get("podIP"))),
            what="vol with a pod IP",
        )
        url = f"http://{pod['status']['podIP']}:8080/health"
        wait_for(lambda: _fetch(url) is not None, what=f"the process at {url}", timeout=60)
        log = testbed.logs / "podrunner.log"
        before = log.read_text(errors="replace").count("pod runner watching pods")
        # Longer than the runner's volume refresh period, so it runs into the outage.
        testbed.restart_apiserver(down_seconds=5)
        wait_for(lambda: _fetch(url) is not None, what=f"{url} after the restart", timeout=30)
        after = log.read_text(errors="replace").count("pod runner watching pods")
        assert after == before, "the pod runner restarted, and every process with it"
        started = [
            line
            for path in (testbed.logs / "pods").glob(f"{ns}_vol_*.log")
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith("--- ")
        ]
        assert len(started) == 1, started
        # Reports resume: a crash after the restart is seen (once
        # the scheduler and kwok have caught up).
        apply(testbed, ns, run_pod("after", "import sys; sys.exit(1)"))
        wait_for(
            lambda: _waiting(testbed, ns, "after", "CrashLoopBackOff"),
            what="after in CrashLoopBackOff",
            timeout=AFTER_API_RESTART_SECONDS,
        )
