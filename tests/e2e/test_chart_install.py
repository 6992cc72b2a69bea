"""`helm install` exactly as README says, on the real control plane: the
operator Deployment's pod runs (by the pod runner) as the chart's
ServiceAccount, reconciles a sample, survives `helm upgrade`, passes `helm
test`, and `helm uninstall` leaves nothing behind but the CRD. The API
server's audit log then shows that the chart's RBAC is exactly what the
operator used: nothing it was refused, nothing granted that it never needed."""

from __future__ import annotations

import datetime
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shoal.controller.names import FINALIZER
from shoal_testbed.cluster import REPO, Testbed, bin_dir
from tests.e2e.kube import get_json, wait_for
from tests.e2e.operator_env import (
    cluster_manifest,
    complete,
    delete_clusters,
    router_url,
    wait_ready,
)

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "shoal"
# Granted on purpose though a short e2e run may not exercise them, each with why.
CACHE = "only with spec.model.cache.shared (tests/e2e/test_model_cache.py)"
RARELY_USED = {
    ("", "pods", "", "get"): "the routers' Role grants it, and RBAC grants only what one holds",
    ("", "pods", "", "delete"): "group restarts, health restarts and lost nodes",
    ("apps", "statefulsets", "", "delete"): "scale-down removes a replica's StatefulSets",
    ("", "secrets", "", "get"): "only with spec.engine.apiKeySecret (test_engine_api_key.py)",
    ("", "events", "", "list"): "only while a StatefulSet's pods are refused (Pod Security, quota)",
    ("", "pods", "log", "get"): "only once an engine crashed (test_failures_in_status.py)",
    ("serving.shoal.dev", "vllmclusters", "scale", "patch"): "only with spec.autoscaling",
    ("autoscaling", "horizontalpodautoscalers", "", "list"): "only with spec.autoscaling",
    ("keda.sh", "scaledobjects", "", "list"): "only with spec.autoscaling",
    # The shared model cache: its claim and the download Job.
    ("", "persistentvolumeclaims", "", "create"): CACHE,
    ("", "persistentvolumeclaims", "", "get"): CACHE,
    ("", "persistentvolumeclaims", "", "patch"): CACHE,
    ("batch", "jobs", "", "create"): CACHE,
    ("batch", "jobs", "", "delete"): CACHE,
    ("batch", "jobs", "", "get"): CACHE,
    ("batch", "jobs", "", "patch"): CACHE,
}


def helm(bed: Testbed, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(bin_dir() / "helm"), "--kubeconfig", str(bed.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def namespaces(testbed: Testbed) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    system, apps = f"shoal-system-{suffix}", f"apps-{suffix}"
    testbed.kubectl("create", "namespace", apps)
    try:
        yield system, apps
    finally:
        delete_clusters(testbed, apps)
        subprocess.run(
            [
                str(bin_dir() / "helm"),
                "--kubeconfig",
                str(testbed.kubeconfig),
                "uninstall",
                "shoal",
                "-n",
                system,
            ],
            capture_output=True,
            timeout=120,
        )
        for ns in (apps, doomed(apps), system):
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# How a refused list of VLLMClusters reads (audit_use).
WATCHED = str(("serving.shoal.dev", "vllmclusters", "", "list"))


def doomed(apps: str) -> str:
    """A second watched namespace, deleted while the operator runs."""
    return f"{apps}-doomed"


def chart_rules(
    bed: Testbed, system: str, apps: str, *, hook: bool = False
) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, subresource, verb) the chart grants the operator, or
    with `hook` its uninstall Job."""
    out = subprocess.run(
        [
            str(bin_dir() / "helm"),
            "template",
            "shoal",
            str(CHART),
            "-n",
            system,
            "--set",
            f"operator.watchNamespaces={{{apps}}}",
            "--skip-tests",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    granted = set()
    for doc in yaml.safe_load_all(out):
        if not doc or doc["kind"] not in ("Role", "ClusterRole"):
            continue
        if ("helm.sh/hook" in doc["metadata"].get("annotations", {})) != hook:
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    name, _, sub = resource.partition("/")
                    for verb in rule["verbs"]:
                        granted.add((group, name, sub, verb))
    return granted


def audit_use(
    bed: Testbed, user: str, *, before: str = "9999"
) -> tuple[set[tuple[str, str, str, str]], list[str]]:
    """What `user` did per the audit log (before a stageTimestamp), and what it
    was refused."""
    used, refused = set(), []
    for line in (bed.logs / "audit.log").read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        if event.get("user", {}).get("username") != user or "objectRef" not in event:
            continue
        if event.get("stageTimestamp", "") >= before:
            continue
        ref = event["objectRef"]
        key = (ref.get("apiGroup", ""), ref["resource"], ref.get("subresource", ""), event["verb"])
        code = event.get("responseStatus", {}).get("code", 0)
        if code == 403:
            refused.append(f"{key} {event['requestURI']}")
            continue
        used.add(key)
        if event["verb"] == "patch" and code == 201:
            used.add((*key[:3], "create"))  # server-side apply created it
    return used, refused


def test_helm_install_upgrade_test_uninstall_and_least_privilege(
    testbed: Testbed, namespaces: tuple[str, str], tmp_path: Path
) -> None:
    system, apps = namespaces
    release_values = ["--set", f"operator.watchNamespaces={{{apps}}}"]
    installed_values = ["--set", f"operator.watchNamespaces={{{apps},{doomed(apps)}}}"]
    testbed.kubectl("create", "namespace", doomed(apps))
    helm(
        testbed,
        "install",
        "shoal",
        str(CHART),
        "-n",
        system,
        "--create-namespace",
        *installed_values,
        "--wait",
        "--timeout",
        "180s",
    )
    deployment = f"deploy/shoal -n {system}".split()
    wait_for(
        lambda: (
            testbed.kubectl("get", *deployment, "-o", "jsonpath={.status.availableReplicas}") == "1"
        ),
        what="operator available",
    )
    helm(testbed, "test", "shoal", "-n", system, "--timeout", "120s")

    # The operator (the chart's pod, run as its ServiceAccount) reconciles a sample.
    sample = cluster_manifest("fleet", replicas=2, tensor=4)
    testbed.kubectl("apply", "-n", apps, "-f", "-", input_text=yaml.safe_dump(sample))
    wait_ready(testbed, apps, "fleet", 2, timeout=180)
    assert (
        complete(router_url(testbed, apps, "fleet"), "hello through the chart").status_code == 200
    )
    # A replica on two nodes (the operator annotates its group's pods), in a
    # namespace then deleted: the operator reads its clusters back to take
    # its finalizer off, or the namespace stays Terminating.
    big = cluster_manifest("big", replicas=1, tensor=16, model="meta-llama/Llama-3.1-405B-Instruct")
    testbed.kubectl("apply", "-n", doomed(apps), "-f", "-", input_text=yaml.safe_dump(big))
    wait_ready(testbed, doomed(apps), "big", 1, timeout=180)
    testbed.kubectl("delete", "namespace", doomed(apps), "--timeout=120s")

    operator_ip = testbed.kubectl(
        "get",
        "pods",
        "-n",
        system,
        "-l",
        "app.kubernetes.io/component=operator",
        "-o",
        "jsonpath={.items[0].status.podIP}",
    )
    metrics = httpx.get(f"http://{operator_ip}:8081/metrics", timeout=5).text
    # Parsed, not matched as text: the exposition's label order is the client
    # library's to choose (the image's newer prometheus-client sorts them).
    passes = [
        sample
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "shoal_operator_reconcile_passes_total"
        and sample.labels == {"namespace": apps, "vllmcluster": "fleet", "result": "ok"}
    ]
    assert passes and passes[0].value >= 1, metrics

    # Changed values (the namespace gone from them too) roll the operator,
    # which keeps the fleet as it is.
    helm(
        testbed,
        "upgrade",
        "shoal",
        str(CHART),
        "-n",
        system,
        *release_values,
        "--set",
        "operator.logLevel=DEBUG",
        "--wait",
        "--timeout",
        "180s",
    )
    args = testbed.kubectl(
        "get", *deployment, "-o", "jsonpath={.spec.template.spec.containers[0].args}"
    )
    assert "--log-level=DEBUG" in args

    # The Lease deleted by hand (a cleanup script, a mistaken `kubectl delete
    # lease --all`): the operator makes it again and acts on.
    testbed.kubectl("delete", "lease", "shoal", "-n", system)
    wait_for(
        lambda: testbed.kubectl(
            "get", "lease", "shoal", "-n", system, "-o", "jsonpath={.spec.holderIdentity}",
            check=False,
        ),
        what="the Lease made again and held",
        timeout=60,
    )  # fmt: skip
    testbed.kubectl("scale", "vlc/fleet", "--replicas=1", "-n", apps)
    wait_ready(testbed, apps, "fleet", 1, timeout=180)

    # Uninstalled with the fleet still there: it keeps serving, unmanaged, and
    # can be deleted later without an operator to remove shoal's finalizer.
    # helm deletes the operator's Role and Lease as its pod stops: the
    # release of the Lease it makes then is refused, harmlessly.
    uninstalled = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    helm(testbed, "uninstall", "shoal", "-n", system, "--wait")
    fleet = get_json(testbed, "vllmcluster", "fleet", "-n", apps)
    assert FINALIZER not in fleet["metadata"].get("finalizers", []), fleet["metadata"]
    assert complete(router_url(testbed, apps, "fleet"), "still serving").status_code == 200
    testbed.kubectl("delete", "vllmcluster", "fleet", "-n", apps, "--timeout=30s")
    wait_for(
        lambda: not testbed.kubectl("get", "statefulsets", "-n", apps, "-o", "name"),
        what="the fleet's StatefulSets collected with their VLLMCluster",
    )
    left = testbed.kubectl("get", "deploy,sa,role,rolebinding", "-n", system, "-o", "name")
    assert "shoal" not in left.replace("serviceaccount/default", ""), left
    cluster_left = testbed.kubectl("get", "clusterrole,clusterrolebinding", "-o", "name")
    assert "clusterrole.rbac.authorization.k8s.io/shoal-cluster" not in cluster_left
    assert testbed.kubectl("get", "crd", "vllmclusters.serving.shoal.dev", "-o", "name").strip()

    # Least privilege, from what the API server saw the chart's account do.
    used, refused = audit_use(testbed, f"system:serviceaccount:{system}:shoal", before=uninstalled)
    # The deleted namespace's Role went with it, and kopf's watch there was
    # refused until the upgrade rolled the operator without it.
    gone = f"/namespaces/{doomed(apps)}/vllmclusters?"
    refused = [r for r in refused if not (r.startswith(WATCHED) and gone in r)]
    assert not refused, "the chart refused the operator:\n" + "\n".join(refused)
    granted = chart_rules(testbed, system, apps)
    assert used <= granted, f"used but not granted: {sorted(used - granted)}"
    unused = granted - used - set(RARELY_USED)
    assert not unused, f"granted but never used (remove them or say why): {sorted(unused)}"
    # And the uninstall Job's: no more than it used; `get` only when a
    # cluster's finalizers change under its patch.
    used, refused = audit_use(testbed, f"system:serviceaccount:{system}:shoal-release")
    assert used and not refused, refused
    granted = chart_rules(testbed, system, apps, hook=True)
    unused = granted - used - {("serving.shoal.dev", "vllmclusters", "", "get")}
    assert used <= granted and not unused, (used, granted)
