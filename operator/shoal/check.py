"""`shoal check`: is shoal installed and working? The chart's `helm test` runs
it in the cluster: the VLLMCluster API must be served and the operator
Deployment available."""

from __future__ import annotations

import argparse
from typing import Any

from shoal.api import GROUP, PLURAL, VERSION


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check", help="check that the VLLMCluster API is served and the operator is available"
    )
    parser.add_argument("--namespace", required=True, help="namespace of the operator")
    parser.add_argument("--deployment", required=True, help="name of the operator Deployment")
    parser.set_defaults(func=run)


def _client() -> Any:
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client


def run(args: argparse.Namespace) -> int:
    client = _client()
    failures = 0
    try:
        resources = client.CustomObjectsApi().get_api_resources(GROUP, VERSION).resources
        served = any(r.name == PLURAL for r in resources)
    except client.ApiException as error:
        served, resources = False, []
        print(f"FAIL API {GROUP}/{VERSION}: {error.status} {error.reason}")
    if served:
        print(f"ok   API {GROUP}/{VERSION} serves {PLURAL}")
    else:
        failures += 1
        print(f"FAIL {PLURAL}.{GROUP} is not served: install the CRD (charts/shoal/crds/)")
    try:
        deployment = client.AppsV1Api().read_namespaced_deployment(args.deployment, args.namespace)
        available = deployment.status.available_replicas or 0
    except client.ApiException as error:
        available = 0
        print(f"FAIL deployment {args.namespace}/{args.deployment}: {error.status} {error.reason}")
    if available >= 1:
        print(f"ok   operator {args.namespace}/{args.deployment}: {available} available")
    else:
        failures += 1
        print(f"FAIL operator {args.namespace}/{args.deployment} has no available replica")
    return 1 if failures else 0
