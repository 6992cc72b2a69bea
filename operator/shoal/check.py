"""`shoal check`: is shoal installed and working? The chart's `helm test` runs
it in the cluster: the VLLMCluster API must be served and the operator
Deployment available."""

from __future__ import annotations

import argparse
import asyncio

from shoal.api import API_VERSION, GROUP, PLURAL
from shoal.controller.kube import ApiError, KubeApi


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check", help="check that the VLLMCluster API is served and the operator is available"
    )
    parser.add_argument("--namespace", required=True, help="namespace of the operator")
    parser.add_argument("--deployment", required=True, help="name of the operator Deployment")
    parser.set_defaults(func=run)


async def _check(args: argparse.Namespace) -> int:
    kube = KubeApi(component="check")
    failures = 0
    try:
        try:
            served = PLURAL in await kube.resource_names(API_VERSION)
        except ApiError as error:
            served = False
            print(f"FAIL API {API_VERSION}: {error}")
        if served:
            print(f"ok   API {API_VERSION} serves {PLURAL}")
        else:
            failures += 1
            print(f"FAIL {PLURAL}.{GROUP} is not served: install the CRD (charts/shoal/crds/)")
        where = f"{args.namespace}/{args.deployment}"
        try:
            deployment = await kube.get("apps/v1", "Deployment", args.namespace, args.deployment)
            if deployment is None:
                print(f"FAIL deployment {where} not found")
        except ApiError as error:
            deployment = None
            print(f"FAIL deployment {where}: {error}")
        available = (deployment or {}).get("status", {}).get("availableReplicas") or 0
        if available >= 1:
            print(f"ok   operator {where}: {available} available")
        else:
            failures += 1
            print(f"FAIL operator {where} has no available replica")
    finally:
        await kube.close()
    return 1 if failures else 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_check(args))
