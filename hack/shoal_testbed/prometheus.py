"""A real Prometheus on the testbed, configured from the chart's monitors.

prometheus-operator turns a ServiceMonitor or PodMonitor into a scrape job
with Kubernetes service discovery and relabelling rules (keep the pods or
endpoints whose labels match the selector and whose port has the named port,
then the monitor's own relabelings), and a PrometheusRule into a rules file.
`scrape_config` and `rules_file` do the same on plain manifests (the output of
`helm template`), following prometheus-operator's generator
(pkg/prometheus/promcfg.go), so Prometheus scrapes exactly what the chart's
monitors select; `Prometheus` runs the binary hack/testbed/build-prometheus.sh
builds against the testbed's API server (its admin kubeconfig).

The operator itself is not run: it creates Prometheus as a StatefulSet of
container images (Prometheus, its config reloader) that this testbed cannot
pull, and its generated config assumes in-cluster paths and credentials.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from shoal_testbed import procs

Manifest = Mapping[str, Any]

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".testbed" / "prometheus" / "bin"
SERVICE_MONITOR = "ServiceMonitor"
POD_MONITOR = "PodMonitor"
PROMETHEUS_RULE = "PrometheusRule"
MONITOR_KINDS = (SERVICE_MONITOR, POD_MONITOR, PROMETHEUS_RULE)


def binary(name: str) -> Path:
    """prometheus or promtool, as build-prometheus.sh links them."""
    return BIN / name


def monitors(manifests: Iterable[Manifest]) -> list[Manifest]:
    """The monitoring.coreos.com objects among rendered manifests."""
    return [m for m in manifests if m and m.get("kind") in MONITOR_KINDS]


def _sanitize(label: str) -> str:
    # Kubernetes SD's meta label names: every invalid character becomes `_`.
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def selector_relabelings(selector: Manifest, *, kind: str) -> list[dict[str, Any]]:
    """keep/drop rules for a label selector on pod or service labels."""
    prefix = f"__meta_kubernetes_{kind}_label"
    present = f"__meta_kubernetes_{kind}_labelpresent"
    rules: list[dict[str, Any]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        name = _sanitize(key)
        rules.append(
            {
                "action": "keep",
                "source_labels": [f"{prefix}_{name}", f"{present}_{name}"],
                "regex": f"({re.escape(str(value))});true",
            }
        )
    for expression in selector.get("matchExpressions") or []:
        name, operator = _sanitize(expression["key"]), expression["operator"]
        values = "|".join(re.escape(str(v)) for v in expression.get("values") or [])
        if operator in ("In", "NotIn"):
            rules.append(
                {
                    "action": "keep" if operator == "In" else "drop",
                    "source_labels": [f"{prefix}_{name}", f"{present}_{name}"],
                    "regex": f"({values});true",
                }
            )
        elif operator in ("Exists", "DoesNotExist"):
            rules.append(
                {
                    "action": "keep" if operator == "Exists" else "drop",
                    "source_labels": [f"{present}_{name}"],
                    "regex": "true",
                }
            )
        else:
            raise ValueError(f"unknown selector operator {operator!r}")
    return rules


def _namespaces(monitor: Manifest) -> dict[str, Any]:
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return {}
    names = chosen.get("matchNames") or [monitor["metadata"]["namespace"]]
    return {"namespaces": {"names": list(names)}}


def _relabelings(rules: Sequence[Manifest]) -> list[dict[str, Any]]:
    """A monitor's relabelings (camelCase) in Prometheus's spelling."""
    spelled = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "action": "action",
        "regex": "regex",
        "replacement": "replacement",
        "separator": "separator",
        "modulus": "modulus",
    }
    return [{spelled[k]: v for k, v in rule.items()} for rule in rules]


def scrape_config(monitor: Manifest, *, kubeconfig: Path) -> list[dict[str, Any]]:
    """One scrape job per endpoint of a ServiceMonitor or PodMonitor."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    namespace, name = meta["namespace"], meta["name"]
    pods = kind == POD_MONITOR
    role, endpoints_key = ("pod", "podMetricsEndpoints") if pods else ("endpoints", "endpoints")
    jobs = []
    for index, endpoint in enumerate(spec.get(endpoints_key) or []):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            *selector_relabelings(spec.get("selector") or {}, kind="pod" if pods else "service"),
        ]
        port = endpoint["port"]
        if pods:
            relabel += [
                {
                    "action": "drop",
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)",
                },
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": port,
                },
            ]
        else:
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": port,
                }
            )
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ]
        if pods:
            relabel.append({"target_label": "job", "replacement": f"{namespace}/{name}"})
        else:
            relabel += [
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            ]
        relabel.append({"target_label": "endpoint", "replacement": port})
        relabel += _relabelings(endpoint.get("relabelings") or [])
        job: dict[str, Any] = {
            "job_name": f"{'podMonitor' if pods else 'serviceMonitor'}/{namespace}/{name}/{index}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "kubernetes_sd_configs": [
                {"role": role, "kubeconfig_file": str(kubeconfig), **_namespaces(monitor)}
            ],
            "relabel_configs": relabel,
        }
        if "interval" in endpoint:
            job["scrape_interval"] = endpoint["interval"]
            job["scrape_timeout"] = endpoint["interval"]
        jobs.append(job)
    return jobs


def rules_file(rules: Manifest) -> dict[str, Any]:
    """A PrometheusRule's groups, as Prometheus reads a rules file."""
    return {"groups": list(rules["spec"]["groups"])}


def config(
    objects: Iterable[Manifest],
    *,
    kubeconfig: Path,
    rule_files: Sequence[Path],
    interval: str = "15s",
) -> dict[str, Any]:
    jobs = [
        job
        for m in objects
        if m["kind"] in (SERVICE_MONITOR, POD_MONITOR)
        for job in scrape_config(m, kubeconfig=kubeconfig)
    ]
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }


@dataclass
class Prometheus:
    """A running Prometheus process and its HTTP API."""

    url: str
    process: subprocess.Popen[bytes]
    directory: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on a parse error)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def api(self, path: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/{path}", timeout=10)
        answer.raise_for_status()
        return answer.json()["data"]

    def targets(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("targets?state=active")["activeTargets"]
        return found

    def alerts(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def stop(self) -> None:
        procs.stop_group(self.process.pid, grace_seconds=5)


def start(
    directory: Path,
    *,
    objects: Iterable[Manifest],
    kubeconfig: Path,
    interval: str = "15s",
    die_with_parent: bool = True,
) -> Prometheus:
    """Prometheus scraping what objects' monitors select, with their rules,
    on a free loopback port; its data, config and log in directory."""
    prometheus = binary("prometheus")
    if not prometheus.exists():
        raise RuntimeError(f"{prometheus} missing: run `bash hack/testbed/build-prometheus.sh`")
    objects = list(objects)
    if directory.exists():
        shutil.rmtree(directory)
    (directory / "rules").mkdir(parents=True)
    rule_paths = []
    for m in objects:
        if m["kind"] == PROMETHEUS_RULE:
            path = (
                directory / "rules" / f"{m['metadata']['namespace']}-{m['metadata']['name']}.yaml"
            )
            path.write_text(yaml.safe_dump(rules_file(m), sort_keys=False))
            rule_paths.append(path)
    config_path = directory / "prometheus.yml"
    config_path.write_text(
        yaml.safe_dump(
            config(objects, kubeconfig=kubeconfig, rule_files=rule_paths, interval=interval),
            sort_keys=False,
        )
    )
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    process = procs.start(
        [
            str(prometheus),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=info",
        ],
        log_path=directory / "prometheus.log",
        die_with_parent=die_with_parent,
    )
    procs.wait_until(
        lambda: procs.http_ok(f"{url}/-/ready"),
        what="prometheus",
        timeout_seconds=60,
        is_alive=lambda: process.poll() is None,
        log_path=directory / "prometheus.log",
    )
    return Prometheus(url=url, process=process, directory=directory)


def wait_for_series(server: Prometheus, expr: str, *, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = server.query(expr)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(1)
