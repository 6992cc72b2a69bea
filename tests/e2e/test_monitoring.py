"""The chart's monitoring read by a real Prometheus (hack/shoal_testbed/prometheus.py):
the chart installed as README says with its ServiceMonitor, PodMonitor,
PrometheusRule and NetworkPolicy on (the monitors validated by the API server
against prometheus-operator's own CRDs), a two-replica simulator fleet under
steady load through its router; the replicas answer some requests 500 for a
while (the router retries them elsewhere), then one hangs, so the operator
restarts it.

- Prometheus scrapes exactly what the monitors select: the operator, both
  routers and both engines are targets and up, a pod that only looks like an
  engine (component: engine, not managed by shoal) is not a target; the
  VLLMCluster's name is the `vllmcluster` label.
- The NetworkPolicies as rendered: the engines' selects the fleet's engine
  pods and not the look-alike, and admits the metrics scraper named in
  networkPolicy.metricsFrom on the engines' http port; the routers' selects
  the fleet's routers, admits any pod to their OpenAI API and only shoal's
  routers, the operator and the scraper to their internal port. Nothing on
  the kwok nodes enforces NetworkPolicy: this shows whom the policies
  admit and that the targets are up with them in place, not that packets from
  other pods are dropped (the real node enforces them: tests/node).
- The hung replica's restart fires ShoalReplicaRestarted in Prometheus.
- Every expression of every dashboard panel, read from the dashboard JSON,
  parses, returns series for the fleet, and has sane values for its unit.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from shoal_testbed.cluster import REPO, Testbed, bin_dir
from shoal_testbed.prometheus import Prometheus, selects
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    cluster_manifest,
    delete_clusters,
    events,
    install_crd,
    router_url,
    wait_ready,
)
from tests.e2e.test_warmup_gating import PROMPTS, SteadyLoad

pytestmark = pytest.mark.e2e

PATTERN = "shoal-mon"
CHART = REPO / "charts" / "shoal"
DASHBOARD = CHART / "dashboards" / "shoal.json"
RELEASE = "shoal-mon"  # fullname too: jobs shoal-mon-metrics and <ns>/shoal-mon-fleets
FLEET = "fleet"
# The scraper the NetworkPolicy admits (values' networkPolicy.metricsFrom).
NAMESPACE_NAME = "kubernetes.io/metadata.name"  # the label every namespace has
SCRAPER_NAMESPACE = {NAMESPACE_NAME: "monitoring"}
SCRAPER_POD = {"app.kubernetes.io/name": "prometheus"}
# Quick to find the hung replica, slow enough (5 s canary) not to take a
# busy machine's slow answers for a hang.
FAST_HEALTH = {
    "periodSeconds": 1,
    "canaryTimeoutSeconds": 5,
    "failureThreshold": 2,
    "restartBackoff": {"initialSeconds": 1, "maxSeconds": 2},
}


@dataclass(frozen=True)
class Monitored:
    system: str
    apps: str
    router: str


def helm(bed: Testbed, *args: str) -> str:
    result = subprocess.run(
        [str(bin_dir() / "helm"), "--kubeconfig", str(bed.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _values(apps: str) -> dict[str, Any]:
    return {
        "operator": {"watchNamespaces": [apps]},
        "networkPolicy": {
            "enabled": True,
            "namespaces": [apps],
            "metricsFrom": [
                {
                    "namespaceSelector": {"matchLabels": SCRAPER_NAMESPACE},
                    "podSelector": {"matchLabels": SCRAPER_POD},
                }
            ],
        },
        "monitoring": {
            "serviceMonitor": {"enabled": True, "interval": "2s"},
            "podMonitor": {"enabled": True, "interval": "2s"},
            "prometheusRule": {"enabled": True},
        },
    }


def _look_alike(apps: str) -> dict[str, Any]:
    """A pod labelled like an engine of the fleet but not made by shoal."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "not-shoal-engine",
            "labels": {
                "app.kubernetes.io/component": "engine",
                "serving.shoal.dev/cluster": FLEET,
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "example.com/other-engine:1",
                    "ports": [{"name": "http", "containerPort": 8000}],
                }
            ],
        },
    }


def _wait_for_series(prometheus: Prometheus, expr: str, *, what: str, timeout: float) -> None:
    """Wait for expr to return series; a timeout says what Prometheus scrapes."""
    try:
        wait_for(lambda: prometheus.query(expr), what=what, timeout=timeout, interval=1)
    except TimeoutError as error:
        targets = [
            f"{t['labels'].get('job')} {t['labels'].get('pod')} {t['health']} {t['lastError']}"
            for t in prometheus.targets()
        ]
        raise TimeoutError(f"{error}; targets:\n" + "\n".join(targets)) from None


@pytest.fixture(scope="module")
def monitored(
    testbed: Testbed, prometheus: Prometheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    install_crd(testbed)
    suffix = uuid.uuid4().hex[:6]
    system, apps = f"{PATTERN}-sys-{suffix}", f"{PATTERN}-{suffix}"
    testbed.kubectl("create", "namespace", apps)
    wait_for(
        lambda: testbed.kubectl("get", "serviceaccount", "default", "-n", apps, check=False),
        what=f"default ServiceAccount in {apps}",
    )
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(yaml.safe_dump(_values(apps)))
    try:
        helm(
            testbed,
            *("install", RELEASE, str(CHART), "-n", system, "--create-namespace"),
            *("-f", str(values), "--wait", "--timeout", "180s"),
        )
        apply(testbed, apps, _look_alike(apps))
        manifest = cluster_manifest(
            FLEET,
            replicas=2,
            engine={
                "maxModelLen": 8192,
                "extraArgs": ["--sim-time-scale", "50", "--sim-fault-api"],
            },
            warmup={"prompts": PROMPTS, "timeoutSeconds": 30},
            health=FAST_HEALTH,
        )
        apply(testbed, apps, manifest)
        wait_ready(testbed, apps, FLEET, 2, timeout=180)
        url = router_url(testbed, apps, FLEET)
        with SteadyLoad(url) as load:
            wait_for(lambda: len(load.routed) >= 20, what="steady load flowing", timeout=60)
            # The restart counter (from 0) is scraped before the restart, so
            # the alert sees an increase.
            _wait_for_series(
                prometheus,
                f'shoal_operator_events_total{{reason="ReplicaRestarted", namespace="{apps}",'
                f' vllmcluster="{FLEET}"}}',
                what="the restart counter in Prometheus",
                timeout=90,
            )
            # Every replica answers a fifth of its requests 500 for a while
            # (whichever the router prefers): it retries them elsewhere, the
            # retries panel's data (the router exports no series for a reason
            # before its first retry). Below spec.health.routerErrors'
            # threshold (half), so no restart.
            engines = [get_json(testbed, "pod", f"{FLEET}-r{i}-0", "-n", apps) for i in range(2)]
            faults = [f"http://{e['status']['podIP']}:8000/_sim/fault" for e in engines]
            for url_of_faults in faults:
                httpx.post(url_of_faults, json={"error_rate": 0.2}, timeout=5).raise_for_status()
            _wait_for_series(
                prometheus,
                f'shoal_router_retries_total{{namespace="{apps}", vllmcluster="{FLEET}"}}',
                what="router retries in Prometheus",
                timeout=60,
            )
            for url_of_faults in faults:
                # A replica restarted meanwhile has no faults left to clear.
                with contextlib.suppress(httpx.ConnectError):
                    httpx.post(url_of_faults, json={"error_rate": 0}, timeout=5)
            hung = get_json(testbed, "pod", f"{FLEET}-r1-0", "-n", apps)
            engine = f"http://{hung['status']['podIP']}:8000"
            httpx.post(engine + "/_sim/fault", json={"hang": True}, timeout=5).raise_for_status()
            yield Monitored(system=system, apps=apps, router=url)
    finally:
        delete_clusters(testbed, apps)
        subprocess.run(
            [
                str(bin_dir() / "helm"),
                f"--kubeconfig={testbed.kubeconfig}",
                "uninstall",
                RELEASE,
                *("-n", system),
            ],
            capture_output=True,
            timeout=120,
        )
        for ns in (apps, system):
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---- targets and labels


def _is_engine(pod: str) -> bool:
    return re.fullmatch(rf"{FLEET}-r\d+-\d+", pod) is not None


def _targets(prometheus: Prometheus, fleet: Monitored) -> list[dict[str, Any]]:
    jobs = {f"{RELEASE}-metrics", f"{fleet.system}/{RELEASE}-fleets"}
    return [t for t in prometheus.targets() if t["labels"].get("job") in jobs]


def test_prometheus_scrapes_the_operator_routers_and_engines_and_nothing_else(
    testbed: Testbed, prometheus: Prometheus, monitored: Monitored
) -> None:
    def expected() -> set[str]:
        pods = get_json(
            testbed, "pods", "-n", monitored.apps, "-l", "app.kubernetes.io/managed-by=shoal"
        )
        operator = get_json(
            testbed, "pods", "-n", monitored.system, "-l", "app.kubernetes.io/component=operator"
        )
        return {p["metadata"]["name"] for p in [*pods["items"], *operator["items"]]}

    def all_up() -> dict[str, dict[str, Any]] | None:
        found = {t["labels"]["pod"]: t for t in _targets(prometheus, monitored)}
        healthy = all(t["health"] == "up" for t in found.values())
        return found if healthy and set(found) == expected() else None

    # The hung replica's new pods take a restart and a warm-up to answer.
    found = wait_for(
        all_up, what="exactly shoal's pods as targets, all up", timeout=180, interval=1
    )
    assert "not-shoal-engine" not in found
    engines = [t for t in found.values() if _is_engine(t["labels"]["pod"])]
    assert len(engines) == 2
    # Each pod once: engines on their http port, routers on their internal one
    # (which a client port full at maxClientConnections does not refuse).
    pods = [t["labels"]["pod"] for t in _targets(prometheus, monitored)]
    assert sorted(pods) == sorted(found), pods
    routers = [t for t in found.values() if t["labels"]["pod"].startswith(f"{FLEET}-router-")]
    assert routers and {t["labels"]["endpoint"] for t in routers} == {"internal"}, routers
    assert {t["labels"]["endpoint"] for t in engines} == {"http"}, engines
    for target in engines:
        # The VLLMCluster's name under its own label; `cluster` left for the
        # Kubernetes cluster's name that multi-cluster setups add.
        assert target["labels"]["vllmcluster"] == FLEET
        assert "cluster" not in target["labels"]
        assert target["labels"]["namespace"] == monitored.apps
    # The operator's series carry the cluster's namespace, not the operator's.
    replicas = prometheus.query(
        f'shoal_operator_cluster_replicas{{namespace="{monitored.apps}", vllmcluster="{FLEET}"}}'
    )
    assert {r["metric"]["state"]: float(r["value"][1]) for r in replicas}["desired"] == 2
    # What ShoalOperatorNotLeading reads: the release's one operator, under
    # its own namespace, holds the Lease.
    leading = prometheus.query(f'shoal_operator_leading{{job="{RELEASE}-metrics"}}')
    assert [(r["metric"]["namespace"], r["value"][1]) for r in leading] == [(monitored.system, "1")]


def _admits(
    policy: Mapping[str, Any],
    *,
    namespace_labels: Mapping[str, str],
    pod_labels: Mapping[str, str],
    port: str,
) -> bool:
    """Whether a pod with these labels, in a namespace with these labels, may
    reach a pod the policy selects on the named port, by NetworkPolicy's rules:
    a rule without `from` admits every pod; a peer without namespaceSelector
    means the policy's own namespace, one without podSelector every pod."""
    own = policy["metadata"]["namespace"] == namespace_labels.get(NAMESPACE_NAME)
    for rule in policy["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if ports and not any(p.get("port") == port for p in ports):
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                in_namespace = selects(peer["namespaceSelector"], namespace_labels)
            else:
                in_namespace = own
            if in_namespace and selects(peer.get("podSelector") or {}, pod_labels):
                return True
    return False


def _policies(testbed: Testbed, monitored: Monitored) -> dict[str, dict[str, Any]]:
    policies = get_json(testbed, "networkpolicies", "-n", monitored.apps)["items"]
    return {p["metadata"]["name"].removeprefix(f"{RELEASE}-"): p for p in policies}


def _selected(policy: Mapping[str, Any], pods: list[dict[str, Any]]) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in pods
        if selects(policy["spec"]["podSelector"], p["metadata"].get("labels") or {})
    }


def _a_target_up(
    prometheus: Prometheus, monitored: Monitored, pods: set[str], *, what: str
) -> list[dict[str, Any]]:
    """The targets of these pods that are up, once there is one."""
    found: list[dict[str, Any]] = wait_for(
        lambda: (
            [
                t
                for t in _targets(prometheus, monitored)
                if t["labels"]["pod"] in pods and t["health"] == "up"
            ]
            or None
        ),
        what=what,
        timeout=120,
        interval=1,
    )
    return found


def test_the_network_policy_selects_only_shoals_engines_and_admits_the_configured_scraper(
    testbed: Testbed, prometheus: Prometheus, monitored: Monitored
) -> None:
    policies = _policies(testbed, monitored)
    assert sorted(policies) == ["engines", "routers"]
    policy = policies["engines"]
    pods = get_json(testbed, "pods", "-n", monitored.apps)["items"]
    selected = _selected(policy, pods)
    engines = {p["metadata"]["name"] for p in pods if _is_engine(p["metadata"]["name"])}
    assert selected == engines, "the policy selects exactly the fleet's engines"
    assert "not-shoal-engine" not in selected
    assert _admits(policy, namespace_labels=SCRAPER_NAMESPACE, pod_labels=SCRAPER_POD, port="http")
    assert not _admits(
        policy,
        namespace_labels={NAMESPACE_NAME: "other"},
        pod_labels=SCRAPER_POD,
        port="http",
    )
    # With the policy in place (not enforced here), the engines' targets are up.
    assert _a_target_up(prometheus, monitored, engines, what="an engine target up")


def test_the_routers_policy_keeps_their_internal_port_to_shoal_and_the_scraper(
    testbed: Testbed, prometheus: Prometheus, monitored: Monitored
) -> None:
    policy = _policies(testbed, monitored)["routers"]
    pods = get_json(testbed, "pods", "-n", monitored.apps)["items"]
    routers = {
        p["metadata"]["name"]: p["metadata"]["labels"]
        for p in pods
        if p["metadata"]["name"].startswith(f"{FLEET}-router-")
    }
    assert routers and _selected(policy, pods) == set(routers)
    [operator] = get_json(
        testbed, "pods", "-n", monitored.system, "-l", "app.kubernetes.io/component=operator"
    )["items"]
    apps = {NAMESPACE_NAME: monitored.apps}
    system = {NAMESPACE_NAME: monitored.system}
    anyone = {"app": "client"}
    router_labels = next(iter(routers.values()))
    # The OpenAI API: any pod (no networkPolicy.clientsFrom given).
    for namespace in (apps, {NAMESPACE_NAME: "other"}):
        assert _admits(policy, namespace_labels=namespace, pod_labels=anyone, port="http")
    # The internal port: the other routers (placements), the operator (autoscaling,
    # warm-up) and the scraper; not any pod, in the fleet's namespace or another.
    admitted = {
        "router": (apps, router_labels),
        "operator": (system, operator["metadata"]["labels"]),
        "scraper": (SCRAPER_NAMESPACE, SCRAPER_POD),
    }
    for who, (namespace, labels) in admitted.items():
        assert _admits(policy, namespace_labels=namespace, pod_labels=labels, port="internal"), who
    for namespace in (apps, system, {NAMESPACE_NAME: "other"}):
        assert not _admits(policy, namespace_labels=namespace, pod_labels=anyone, port="internal")
    # A look-alike of a router in another namespace is not a router of this fleet's.
    assert not _admits(
        policy,
        namespace_labels={NAMESPACE_NAME: "other"},
        pod_labels=router_labels,
        port="internal",
    )
    # With the policy in place (not enforced here), the routers are scraped.
    assert _a_target_up(prometheus, monitored, set(routers), what="a router target up")


# ---- alerts


def test_a_hung_replicas_restart_fires_the_replica_restarted_alert(
    testbed: Testbed, prometheus: Prometheus, monitored: Monitored
) -> None:
    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in prometheus.alerts()
            if a["labels"]["alertname"] == "ShoalReplicaRestarted"
            and a["labels"].get("namespace") == monitored.apps
            and a["state"] == "firing"
        ]

    alerts = wait_for(firing, what="ShoalReplicaRestarted firing", timeout=150, interval=1)
    assert alerts[0]["labels"]["vllmcluster"] == FLEET
    assert alerts[0]["labels"]["severity"] == "warning"
    assert f"{monitored.apps}/{FLEET}" in alerts[0]["annotations"]["summary"]
    # The restart is the hung replica's (replica 1), as its Event says.
    restarts = [
        e["message"]
        for e in events(testbed, monitored.apps, FLEET)
        if e["reason"] == "ReplicaRestarted"
    ]
    assert any("replica 1" in m for m in restarts), restarts


# ---- the dashboard


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    unit: str
    legend: str
    expr: str


def dashboard_queries(
    dashboard: Mapping[str, Any], *, namespace: str, cluster: str
) -> list[PanelQuery]:
    """Every panel target's expression, with the dashboard's variables set
    to one namespace and one VLLMCluster."""
    variables = {"namespace": namespace, "vllmcluster": cluster}
    declared = {v["name"] for v in dashboard["templating"]["list"]} - {"datasource"}
    assert declared == set(variables), f"dashboard variables {declared}: give each a test value"
    found = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], target["expr"])
            found.append(
                PanelQuery(
                    panel=panel["title"],
                    unit=panel["fieldConfig"]["defaults"]["unit"],
                    legend=target.get("legendFormat", ""),
                    expr=expr,
                )
            )
    return found


def _insane(query: PanelQuery, values: list[float]) -> str | None:
    """What is wrong with a panel's values for its unit, or None."""
    if any(math.isnan(v) or math.isinf(v) for v in values):
        return "NaN or infinite"
    if any(v < 0 for v in values):
        return "negative"
    if query.panel.startswith("Circuit breaker state"):
        return None if set(values) <= {0, 1, 2} else "not a breaker state"
    if query.unit == "percentunit":
        return None if all(v <= 1 for v in values) else "a ratio above 1"
    if query.unit in ("s", "short", "reqps"):
        return None
    return f"no sanity check for unit {query.unit!r}: add one"


def test_every_dashboard_panel_has_data_with_sane_values(
    prometheus: Prometheus, monitored: Monitored
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard, namespace=monitored.apps, cluster=FLEET)
    assert len(queries) >= len(dashboard["panels"])
    # The variables' own queries: label_values(vllm:num_requests_running, ...).
    assert prometheus.query(
        f'count by (vllmcluster) (vllm:num_requests_running{{namespace="{monitored.apps}"}})'
    )

    def results() -> dict[PanelQuery, list[dict[str, Any]]] | None:
        # One instant for every query, so p50 and p99 read the same data.
        at = time.time()
        found = {q: prometheus.query(q.expr, at=at) for q in queries}  # raises on a parse error
        return found if all(found.values()) else None

    try:
        found = wait_for(results, what="every panel with data", timeout=150, interval=2)
    except TimeoutError:
        empty = [
            f"{q.panel} [{q.legend}]: {q.expr}" for q in queries if not prometheus.query(q.expr)
        ]
        raise AssertionError("panels without data:\n" + "\n".join(empty)) from None
    problems = []
    for query, series in found.items():
        values = [float(s["value"][1]) for s in series]
        if (problem := _insane(query, values)) is not None:
            problems.append(f"{query.panel} [{query.legend}] {problem}: {values}")
    assert not problems, "\n".join(problems)
    # Latency quantiles in order within each panel (same instant, same data).
    by_panel: dict[str, dict[str, float]] = {}
    for query, series in found.items():
        if query.legend in ("p50", "p99"):
            by_panel.setdefault(query.panel, {})[query.legend] = float(series[0]["value"][1])
    assert by_panel, "no latency panels found"
    for panel, quantiles in by_panel.items():
        assert quantiles["p50"] <= quantiles["p99"], f"{panel}: p50 above p99: {quantiles}"
