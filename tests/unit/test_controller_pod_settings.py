"""Pod settings a platform needs (spec.engine.pod, spec.router.pod): they reach
every engine pod (leaders and workers) and every router pod, beside what shoal
sets, never in place of shoal's own labels, annotations, volumes or mounts; the
router runs two pods spread over nodes under a PodDisruptionBudget, pulls its
image with the operator's pull secrets, and its Service carries annotations."""

from __future__ import annotations

from typing import Any

from shoal.controller.cache import build_download_job
from shoal.controller.desired import desired_fleet
from tests.unit.controller_samples import REF, ROUTER_IMAGE, fleet_of, spec_of

POD: dict[str, Any] = {
    "labels": {"team": "search", "serving.shoal.dev/cluster": "other"},
    "annotations": {"vault.hashicorp.com/agent-inject": "true"},
    "serviceAccountName": "weights-reader",
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "inference",
    "runtimeClassName": "nvidia",
    "volumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
    "volumeMounts": [{"name": "certs", "mountPath": "/etc/ssl/extra"}],
    "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
    "securityContext": {"fsGroup": 2000},
    "containerSecurityContext": {"allowPrivilegeEscalation": False},
}


def _by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def _check_template(template: dict[str, Any]) -> None:
    labels, pod = template["metadata"]["labels"], template["spec"]
    container = pod["containers"][0]
    assert labels["team"] == "search"
    assert labels["serving.shoal.dev/cluster"] == "c", "shoal's selector label must win"
    assert template["metadata"]["annotations"]["vault.hashicorp.com/agent-inject"] == "true"
    assert pod["serviceAccountName"] == "weights-reader"
    assert {"name": "registry"} in pod["imagePullSecrets"]
    assert (pod["priorityClassName"], pod["runtimeClassName"]) == ("inference", "nvidia")
    assert pod["securityContext"] == {"fsGroup": 2000}
    assert pod["volumes"][-1] == POD["volumes"][0] and len(pod["volumes"]) > 1
    assert container["volumeMounts"][-1] == POD["volumeMounts"][0]
    assert len(container["volumeMounts"]) > 1
    assert container["envFrom"] == POD["envFrom"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}


def test_engine_pod_settings_reach_leaders_and_workers_beside_shoals_own() -> None:
    spec = spec_of(parallelism={"tensor": 16}, engine={"maxModelLen": 8192, "pod": POD})
    [replica] = fleet_of(spec).replicas
    assert replica.worker is not None
    for statefulset in replica.manifests:
        template = statefulset["spec"]["template"]
        _check_template(template)
        # Engines still get no API token, whatever their ServiceAccount.
        assert template["spec"]["automountServiceAccountToken"] is False


def test_router_pod_settings_and_scheduling_reach_the_router_pods() -> None:
    router_pod = {
        **POD,
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
    }
    fleet = fleet_of(spec_of(router={"pod": router_pod}))
    [deployment] = _by_kind(fleet.after, "Deployment")
    template = deployment["spec"]["template"]
    _check_template(template)
    assert "serving.shoal.dev/router-config-hash" in template["metadata"]["annotations"]
    pod = template["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == router_pod["tolerations"]
    assert pod["affinity"] == {"nodeAffinity": {}}


def test_routers_are_two_pods_spread_over_nodes_under_a_disruption_budget() -> None:
    fleet = fleet_of(spec_of())
    [deployment] = _by_kind(fleet.after, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    pdbs = {p["metadata"]["name"]: p["spec"] for p in _by_kind(fleet.before, "PodDisruptionBudget")}
    router_selector = deployment["spec"]["selector"]
    assert pdbs["c-router"] == {"maxUnavailable": 1, "selector": router_selector}


def test_the_router_pulls_with_the_operators_secrets_and_the_specs() -> None:
    spec = spec_of(router={"pod": {"imagePullSecrets": [{"name": "team-registry"}]}})
    fleet = desired_fleet(REF, spec, router_image=ROUTER_IMAGE, router_pull_secrets=["ghcr"])
    [deployment] = _by_kind(fleet.after, "Deployment")
    secrets = deployment["spec"]["template"]["spec"]["imagePullSecrets"]
    assert secrets == [{"name": "ghcr"}, {"name": "team-registry"}]
    [plain] = _by_kind(fleet_of(spec_of()).after, "Deployment")
    assert "imagePullSecrets" not in plain["spec"]["template"]["spec"]


def test_a_pull_secret_named_twice_is_listed_once() -> None:
    # The API server warns of every repeat ("duplicate name"), on every apply.
    twice = [{"name": "ghcr"}, {"name": "team"}, {"name": "team"}]
    spec = spec_of(
        model={"cache": {"shared": {}}},
        router={"pod": {"imagePullSecrets": twice}},
        engine={"pod": {"imagePullSecrets": twice}},
    )
    fleet = desired_fleet(
        REF, spec, router_image=ROUTER_IMAGE, router_pull_secrets=["ghcr", "ghcr"]
    )
    [deployment] = _by_kind(fleet.after, "Deployment")
    engines = [m for r in fleet.replicas for m in r.manifests]
    for template in [deployment["spec"]["template"], *(e["spec"]["template"] for e in engines)]:
        assert template["spec"]["imagePullSecrets"] == [{"name": "ghcr"}, {"name": "team"}]
    job = build_download_job(REF, spec, image="shoal:test", pull_secrets=["ghcr", "ghcr"])
    assert job is not None
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "ghcr"}]


def test_router_service_annotations_are_set_for_internal_load_balancers() -> None:
    annotation = {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
    spec = spec_of(router={"service": {"type": "LoadBalancer", "annotations": annotation}})
    [service] = [
        s for s in _by_kind(fleet_of(spec).before, "Service") if "router" in s["metadata"]["name"]
    ]
    assert service["metadata"]["annotations"] == annotation
    assert service["spec"]["type"] == "LoadBalancer"
