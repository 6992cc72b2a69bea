"""The Helm chart rendered and linted by the real helm: every values file in
charts/shoal/ci, least-privilege RBAC in each mode, and bad values refused by
the schema with a message that names them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal_testbed.cluster import REPO, bin_dir
from tests.conftest import require

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "shoal"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    require((bin_dir() / "helm").exists(), "helm missing: run `make testbed`")
    return subprocess.run(
        [str(bin_dir() / "helm"), *args], capture_output=True, text=True, check=check, timeout=120
    )


def render(values: Path | None = None, *extra: str) -> list[dict[str, Any]]:
    args = ["template", "shoal", str(CHART), "--namespace", "shoal-system"]
    if values is not None:
        args += ["-f", str(values)]
    out = helm(*args, *extra).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def kinds(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
def test_lint_and_template_every_values_file(values: Path) -> None:
    lint = helm("lint", str(CHART), "-f", str(values), "--strict", check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(values)
    by_kind = kinds(docs)
    (deployment,) = by_kind["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["args"][0] == "operator"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "shoal", doc["metadata"]["name"]


# A Service's name is a DNS-1035 label (it starts with a letter); a Job's
# becomes a label's value (its pods' job-name): 63 characters at most.
SERVICE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
@pytest.mark.parametrize("release", ["r" * 53, "2024-prod"], ids=["longest", "digit-first"])
def test_any_release_name_helm_takes_renders_names_kubernetes_takes(
    values: Path, release: str
) -> None:
    """Helm takes names of up to 53 characters, and names that start with a digit."""
    out = helm("template", release, str(CHART), "-n", "shoal-system", "-f", str(values)).stdout
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    refused = [
        (d["kind"], d["metadata"]["name"])
        for d in docs
        if (d["kind"] == "Service" and not SERVICE_NAME.fullmatch(d["metadata"]["name"]))
        or (d["kind"] == "Job" and len(d["metadata"]["name"]) > 63)
    ]
    assert not refused, refused


def test_watch_namespaces_get_roles_not_cluster_wide_rules() -> None:
    by_kind = kinds(render(CHART / "ci" / "namespaced-values.yaml"))
    roles = {r["metadata"]["namespace"]: r for r in by_kind["Role"]}
    assert set(roles) >= {"team-a", "team-b"}
    (cluster_role,) = by_kind["ClusterRole"]
    cluster_resources = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    assert "statefulsets" not in cluster_resources, "namespaced mode must not grant cluster-wide"
    # But a cluster's finalizer: a namespace being deleted loses its Role first.
    cluster_rules = {
        (r, v) for rule in cluster_role["rules"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert {r for r in cluster_rules if r[0].startswith("vllmclusters")} == {
        ("vllmclusters", "get"),
        ("vllmclusters", "patch"),
    }
    args = by_kind["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert {p["metadata"]["namespace"] for p in by_kind["NetworkPolicy"]} == {"team-a", "team-b"}


def test_no_rbac_values_create_no_rbac_and_use_the_given_account() -> None:
    by_kind = kinds(render(CHART / "ci" / "no-rbac-values.yaml", "--skip-tests"))
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & set(by_kind)
    assert "ServiceAccount" not in by_kind
    pod = by_kind["Deployment"][0]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-shoal"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    # The operator hands them on to the router pods it creates.
    assert "--router-image-pull-secret=regcred" in pod["containers"][0]["args"]


def test_a_pull_secret_named_twice_is_listed_once() -> None:
    # The API server warns of a repeat ("duplicate name"); the routers got them too.
    docs = render(
        None,
        "--set-json",
        'imagePullSecrets=["regcred", {"name": "regcred"}, "0", "mirror", {"name": "0"}]',
    )
    pod = kinds(docs)["Deployment"][0]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": n} for n in ("regcred", "0", "mirror")]
    passed = [a for a in pod["containers"][0]["args"] if a.startswith("--router-image-pull")]
    assert passed == [f"--router-image-pull-secret={n}" for n in ("regcred", "0", "mirror")]


def test_monitoring_values_add_monitors_and_a_valid_dashboard() -> None:
    by_kind = kinds(render(CHART / "ci" / "monitoring-values.yaml"))
    assert by_kind["ServiceMonitor"][0]["metadata"]["labels"]["release"] == "prometheus"
    assert by_kind["PodMonitor"]
    dashboards = [c for c in by_kind["ConfigMap"] if "shoal.json" in c.get("data", {})]
    dashboard = json.loads(dashboards[0]["data"]["shoal.json"])
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for needed in (
        "kv cache",
        "waiting",
        "running",
        "hit rate",
        "decision",
        "first token",
        "end-to-end",
        "retries",
        "breaker",
    ):
        assert needed in titles, needed


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("operator.logLevel=LOUD", "logLevel"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("operator.replicas=-1", "replicas"),
        ("operator.livenessPort=99999", "livenessPort"),
        # Both of the operator's servers on one port: the second could not bind.
        ("operator.metricsPort=8080", "operator.livenessPort and operator.metricsPort"),
        # A NetworkPolicy for no namespace: nothing protected, and nothing said.
        ("networkPolicy.enabled=true", "networkPolicy.namespaces"),
        # Names, labels and annotations the API server would refuse in the objects.
        ("serviceAccount.name=Shoal_Op", "/serviceAccount/name"),
        ("operator.priorityClassName=High Prio", "/operator/priorityClassName"),
        ("imagePullSecrets[0]=Reg Cred", "/imagePullSecrets/0"),
        ("operator.nodeSelector.gpu node=true", "/operator/nodeSelector"),
        ("operator.podAnnotations.-x=1", "/operator/podAnnotations"),
        ("monitoring.dashboard.labels.grafana=a b", "/monitoring/dashboard/labels"),
        (f"operator.podAnnotations.{'a' * 254}/k=x", "/operator/podAnnotations"),
        ("networkPolicy.namespaces[0]=Team_A", "/networkPolicy/namespaces/0"),
        ("image.tag=v1 ", "/image/tag"),
        # Images the kubelet cannot parse (and YAML would cut at a " #", unquoted).
        ("image.tag=v1 #x", "/image/tag"),
        ("image.repository=ghcr.io/Shoal/shoal", "/image/repository"),
        ("operator.routerImage=a: b", "/operator/routerImage"),
        (f"image.tag=v1@sha256:{'A' * 64}", "/image/tag"),  # digests are lowercase hex
        ("image.repository=[088]/shoal", "/image/repository"),  # an IPv6 host has a ':'
        # The kubelet's bound on an image's path (after its registry) is 255.
        (f"operator.routerImage=r.io/{'a' * 256}:1", "/operator/routerImage"),
        # Durations Prometheus refuses (past 292 years), and with them the whole
        # rules file or scrape config.
        ("monitoring.podMonitor.interval=9999999h", "/monitoring/podMonitor/interval"),
        ("monitoring.prometheusRule.for.degraded=1000000m", "/monitoring/prometheusRule/for"),
    ],
)
def test_bad_values_are_refused_naming_the_value(setting: str, named: str) -> None:
    result = helm("template", "shoal", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert named in result.stderr, result.stderr


@pytest.mark.parametrize("glob", ["team-*", "team-?"])
def test_glob_namespaces_need_cluster_rbac(glob: str) -> None:
    setting = f"operator.watchNamespaces={{{glob}}}"
    result = helm("template", "shoal", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0 and "glob" in result.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    top = sorted((REPO / "crds").glob("*.yaml"))
    assert top and [p.name for p in top] == sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    for path in top:
        assert path.read_text() == (CHART / "crds" / path.name).read_text()


def _operator_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    deployment = kinds(docs)["Deployment"][0]["spec"]["template"]["spec"]
    tests = [doc["spec"] for doc in kinds(docs)["Pod"]]
    return [deployment, *tests]


def test_pods_run_as_non_root_without_a_fixed_uid_unless_one_is_set() -> None:
    # OpenShift's restricted-v2 assigns the UID itself and refuses a pod that sets one.
    for pod in _operator_pods(render()):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert "runAsUser" not in pod["securityContext"]
    for pod in _operator_pods(render(None, "--set", "operator.podSecurityContext.runAsUser=2000")):
        assert pod["securityContext"]["runAsUser"] == 2000


def test_the_default_image_tag_is_the_charts_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    [deployment] = kinds(render())["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{chart['appVersion']}")
    assert f"--router-image={container['image']}" in container["args"]


def test_notes_name_no_file_the_packaged_chart_does_not_ship() -> None:
    # helm renders NOTES only against a cluster, so this reads the template: a user of
    # the packaged chart has no checkout, so examples are a link at the chart's version.
    text = (CHART / "templates" / "NOTES.txt").read_text()
    assert " -f examples/" not in text
    assert "https://github.com/shoal-dev/shoal/tree/v{{ .Chart.AppVersion }}/examples" in text
