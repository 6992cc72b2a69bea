"""A real Prometheus on the testbed, configured from the chart's monitors.

prometheus-operator turns a PodMonitor or ServiceMonitor into a scrape job
with Kubernetes service discovery and relabelling rules (keep the pods whose
labels match the selector and that have the named port, then the monitor's
own relabelings), and a PrometheusRule into a rules file. `pod_monitor_jobs`,
`service_monitor_jobs` and `rules_file` do the same on plain manifests,
following its generator (pkg/prometheus/promcfg.go, v0.85), so Prometheus
scrapes exactly what the chart's monitors select. One difference, forced by
the testbed: a ServiceMonitor's Services have no Endpoints here (see
`service_monitor_jobs`), so their pods are found directly.

`python -m shoal_testbed.prometheus` (started by `make testbed-up` and the
e2e fixture) installs prometheus-operator's monitor CRDs, runs Prometheus, and
every two seconds lists the ServiceMonitors, PodMonitors and PrometheusRules in
the API server and reloads Prometheus when its config changes, as the operator
does.

prometheus-operator itself is not run: it creates Prometheus as a StatefulSet of
container images (Prometheus, its config reloader) that this testbed cannot
pull, and its generated config assumes in-cluster paths and credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
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


def binary(name: str) -> Path:
    """prometheus or promtool, as build-prometheus.sh links them."""
    return BIN / name


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


def selects(selector: Manifest, labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) on labels."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def _target_labels(port: str, *, job: str | None, service: str | None) -> list[dict[str, Any]]:
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    if service is not None:
        relabel.append({"target_label": "service", "replacement": service})
    relabel.append({"target_label": "job", "replacement": job or service})
    relabel.append({"target_label": "endpoint", "replacement": port})
    return relabel


def _job(
    name: str,
    endpoint: Manifest,
    *,
    kubeconfig: Path,
    namespaces: dict[str, Any],
    relabel: list[Any],
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_name": name,
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [
            {"role": "pod", "kubeconfig_file": str(kubeconfig), **namespaces}
        ],
        "relabel_configs": [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            *relabel,
            *_relabelings(endpoint.get("relabelings") or []),
        ],
    }
    if "interval" in endpoint:
        job["scrape_interval"] = endpoint["interval"]
        job["scrape_timeout"] = endpoint["interval"]
    return job


_RUNNING = {
    "action": "drop",
    "source_labels": ["__meta_kubernetes_pod_phase"],
    "regex": "(Failed|Succeeded)",
}


def pod_monitor_jobs(monitor: Manifest, *, kubeconfig: Path) -> list[dict[str, Any]]:
    """One job per podMetricsEndpoint, as prometheus-operator generates it."""
    meta, spec = monitor["metadata"], monitor["spec"]
    jobs = []
    for index, endpoint in enumerate(spec.get("podMetricsEndpoints") or []):
        port = endpoint["port"]
        relabel = [
            *selector_relabelings(spec.get("selector") or {}, kind="pod"),
            _RUNNING,
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": port,
            },
            *_target_labels(port, job=f"{meta['namespace']}/{meta['name']}", service=None),
        ]
        jobs.append(
            _job(
                f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
                endpoint,
                kubeconfig=kubeconfig,
                namespaces=_namespaces(monitor),
                relabel=relabel,
            )
        )
    return jobs


def service_monitor_jobs(
    monitor: Manifest, *, services: Sequence[Manifest], kubeconfig: Path
) -> list[dict[str, Any]]:
    """A ServiceMonitor's endpoints, scraped on the ready pods behind each
    Service it selects.

    prometheus-operator discovers them through the Services' Endpoints, but
    this testbed has none: pods get loopback IPs, which the API server refuses
    in an EndpointSlice ("may not be in the loopback range"). So each selected
    Service and port becomes a pod-role job that keeps what its Endpoints
    would hold: ready, running pods matching the Service's selector, on the
    container port the Service's port targets. Labels are the operator's
    (namespace, service, pod, container, job = the Service's name, endpoint).
    """
    meta, spec = monitor["metadata"], monitor["spec"]
    chosen = spec.get("namespaceSelector") or {}
    names = None if chosen.get("any") else set(chosen.get("matchNames") or [meta["namespace"]])
    jobs = []
    for service in services:
        smeta = service["metadata"]
        if names is not None and smeta["namespace"] not in names:
            continue
        if not selects(spec.get("selector") or {}, smeta.get("labels") or {}):
            continue
        pod_selector = service["spec"].get("selector") or {}
        if not pod_selector:
            continue  # a Service without a selector has hand-made endpoints
        for index, endpoint in enumerate(spec.get("endpoints") or []):
            port = endpoint["port"]
            ports = [p for p in service["spec"].get("ports") or [] if p.get("name") == port]
            if not ports:
                continue
            target = ports[0].get("targetPort", ports[0]["port"])
            by = "name" if isinstance(target, str) else "number"
            relabel = [
                *selector_relabelings({"matchLabels": pod_selector}, kind="pod"),
                _RUNNING,
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_ready"],
                    "regex": "true",
                },
                {
                    "action": "keep",
                    "source_labels": [f"__meta_kubernetes_pod_container_port_{by}"],
                    "regex": str(target),
                },
                *_target_labels(port, job=None, service=smeta["name"]),
            ]
            jobs.append(
                _job(
                    f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}"
                    f"/{smeta['namespace']}/{smeta['name']}",
                    endpoint,
                    kubeconfig=kubeconfig,
                    namespaces={"namespaces": {"names": [smeta["namespace"]]}},
                    relabel=relabel,
                )
            )
    return jobs


def rules_file(rules: Manifest) -> dict[str, Any]:
    """A PrometheusRule's groups, as Prometheus reads a rules file."""
    return {"groups": list(rules["spec"]["groups"])}


def config(
    objects: Sequence[Manifest],
    *,
    kubeconfig: Path,
    rule_files: Sequence[Path],
    interval: str = "15s",
) -> dict[str, Any]:
    """Prometheus's config for the monitors among objects (and the Services
    among them, which ServiceMonitors select)."""
    services = [m for m in objects if m["kind"] == "Service"]
    jobs = []
    for m in objects:
        if m["kind"] == POD_MONITOR:
            jobs += pod_monitor_jobs(m, kubeconfig=kubeconfig)
        elif m["kind"] == SERVICE_MONITOR:
            jobs += service_monitor_jobs(m, services=services, kubeconfig=kubeconfig)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }


@dataclass(frozen=True)
class Prometheus:
    """A running Prometheus (under its runner) and its HTTP API."""

    url: str
    runner_pid: int

    def query(self, expr: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector, now or at a Unix time (raises
        ValueError on a parse error)."""
        params = {"query": expr} if at is None else {"query": expr, "time": str(at)}
        answer = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10)
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

    def config_yaml(self) -> str:
        return str(self.api("status/config")["yaml"])


# ---- the runner: Prometheus plus a loop that keeps its config in step with
# the monitors in the API server (what prometheus-operator's reconciler does).

RUNNER_FILE = "runner.json"
SYNC_SECONDS = 2.0


def crds_dir() -> Path:
    return BIN.parent / "crds"


def install_crds(kubectl: Sequence[str]) -> None:
    """prometheus-operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs."""
    subprocess.run(
        [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(crds_dir())],
        check=True,
        capture_output=True,
        timeout=120,
    )


def listed_monitors(kubectl: Sequence[str]) -> list[Manifest] | None:
    """Every monitor and rule in the API server, and every Service (which
    ServiceMonitors select); None when the API server does not answer."""
    kinds = ",".join(
        ["services"]
        + [
            f"{plural}.monitoring.coreos.com"
            for plural in ("servicemonitors", "podmonitors", "prometheusrules")
        ]
    )
    listed = subprocess.run(
        [*kubectl, "get", kinds, "-A", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if listed.returncode != 0:
        return None
    items: list[Manifest] = json.loads(listed.stdout)["items"]
    return sorted(
        items, key=lambda m: (m["kind"], m["metadata"]["namespace"], m["metadata"]["name"])
    )


def write_config(
    directory: Path, objects: Sequence[Manifest], *, kubeconfig: Path, interval: str
) -> bool:
    """Write prometheus.yml and the rules files; True when anything changed."""
    rules_dir = directory / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    wanted: dict[Path, str] = {}
    for m in objects:
        if m["kind"] == PROMETHEUS_RULE:
            path = rules_dir / f"{m['metadata']['namespace']}-{m['metadata']['name']}.yaml"
            wanted[path] = yaml.safe_dump(rules_file(m), sort_keys=False)
    wanted[directory / "prometheus.yml"] = yaml.safe_dump(
        config(objects, kubeconfig=kubeconfig, rule_files=sorted(wanted), interval=interval),
        sort_keys=False,
    )
    changed = False
    for stale in set(rules_dir.glob("*.yaml")) - set(wanted):
        stale.unlink()
        changed = True
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed = True
    return changed


def run(directory: Path, *, kubeconfig: Path, kubectl_bin: Path, interval: str) -> None:
    """Run Prometheus on a free port and keep its config in step with the
    monitors until terminated (SIGTERM goes to the whole process group)."""
    kubectl = [str(kubectl_bin), f"--kubeconfig={kubeconfig}"]
    install_crds(kubectl)
    write_config(
        directory, listed_monitors(kubectl) or [], kubeconfig=kubeconfig, interval=interval
    )
    port = procs.free_port()
    process = subprocess.Popen(
        [
            str(binary("prometheus")),
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    procs.wait_until(
        lambda: procs.http_ok(f"{url}/-/ready"),
        what="prometheus",
        timeout_seconds=60,
        is_alive=lambda: process.poll() is None,
    )
    (directory / RUNNER_FILE).write_text(json.dumps({"url": url, "pid": os.getpid()}))
    while process.poll() is None:
        time.sleep(SYNC_SECONDS)
        objects = listed_monitors(kubectl)
        if objects is not None and write_config(
            directory, objects, kubeconfig=kubeconfig, interval=interval
        ):
            process.send_signal(signal.SIGHUP)  # Prometheus reloads its config
    raise SystemExit(f"prometheus exited with {process.returncode}")


def attach(directory: Path) -> Prometheus | None:
    """The runner already serving from directory, if one answers."""
    try:
        found = json.loads((directory / RUNNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not procs.alive(int(found["pid"])) or not procs.http_ok(f"{found['url']}/-/ready"):
        return None
    return Prometheus(url=str(found["url"]), runner_pid=int(found["pid"]))


def start(
    directory: Path,
    *,
    kubeconfig: Path,
    kubectl_bin: Path,
    interval: str = "15s",
    die_with_parent: bool = False,
) -> Prometheus:
    """The runner in the background, its log in directory; returns once
    Prometheus answers."""
    if not binary("prometheus").exists():
        raise RuntimeError(f"{binary('prometheus')} missing: run `make prometheus`")
    stop(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    log_path = directory / "prometheus.log"
    runner = procs.start(
        [
            sys.executable,
            "-m",
            "shoal_testbed.prometheus",
            f"--dir={directory}",
            f"--kubeconfig={kubeconfig}",
            f"--kubectl={kubectl_bin}",
            f"--interval={interval}",
        ],
        log_path=log_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "hack")},
        die_with_parent=die_with_parent,
    )
    procs.wait_until(
        lambda: attach(directory) is not None,
        what="prometheus runner",
        timeout_seconds=90,
        is_alive=lambda: runner.poll() is None,
        log_path=log_path,
    )
    found = attach(directory)
    assert found is not None
    return found


def stop(directory: Path) -> None:
    """Stop the runner (and its Prometheus) serving from directory, if any."""
    try:
        pid = int(json.loads((directory / RUNNER_FILE).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return
    procs.stop_group(pid, grace_seconds=10)
    (directory / RUNNER_FILE).unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="shoal_testbed.prometheus", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--kubectl", type=Path, required=True)
    parser.add_argument("--interval", default="15s", help="global scrape and rule interval")
    args = parser.parse_args()
    run(args.dir, kubeconfig=args.kubeconfig, kubectl_bin=args.kubectl, interval=args.interval)


if __name__ == "__main__":
    main()
