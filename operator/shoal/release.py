"""`shoal release`: what `helm uninstall` runs once the operator is gone.

The operator (kopf, for its per-cluster daemon) puts a finalizer on every
VLLMCluster. With no operator left to remove it, deleting a VLLMCluster, or
its namespace, would hang for ever. Uninstalling keeps the fleets serving,
unmanaged; this removes shoal's finalizer from them so that they can be
deleted later (their children go with them, by their owner references). It
waits for the operator's pods to be gone first: a running operator would put
the finalizer back."""

from __future__ import annotations

import argparse
import asyncio
import time

from shoal.api import API_VERSION, KIND
from shoal.controller.finalizer import release
from shoal.controller.identity import Manifest
from shoal.controller.kube import ApiError, KubeApi

POLL_SECONDS = 1.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "release",
        help="remove shoal's finalizer from VLLMClusters once the operator is gone",
        description="What the chart's post-delete hook runs: wait until no operator pod is "
        "left, then remove shoal's finalizer from the VLLMClusters, which keep serving.",
    )
    parser.add_argument(
        "--operator-namespace", required=True, help="namespace of the operator's pods"
    )
    parser.add_argument(
        "--operator-selector", required=True, help="label selector of the operator's pods"
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="release the VLLMClusters of this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--wait-seconds",
        type=float,
        default=120.0,
        help="how long to wait for the operator's pods to go (default: %(default)s)",
    )
    parser.set_defaults(func=run)


async def _operator_gone(kube: KubeApi, args: argparse.Namespace) -> bool:
    deadline = time.monotonic() + args.wait_seconds
    while True:
        pods = await kube.list("v1", "Pod", args.operator_namespace, args.operator_selector)
        if not pods:
            return True
        if time.monotonic() >= deadline:
            names = ", ".join(pod["metadata"]["name"] for pod in pods)
            print(
                f"FAIL operator pods still in {args.operator_namespace} after "
                f"{args.wait_seconds:.0f}s: {names}; they would put the finalizer back. "
                "Once they are gone, run this again (or remove the finalizer with kubectl patch)"
            )
            return False
        await asyncio.sleep(POLL_SECONDS)


async def _release(args: argparse.Namespace) -> int:
    kube = KubeApi(component="release")
    try:
        if not await _operator_gone(kube, args):
            return 1
        clusters: list[Manifest] = []
        for ns in args.namespace or [""]:
            clusters += await kube.list(API_VERSION, KIND, ns, "")
        released = 0
        for cluster in clusters:
            meta = cluster["metadata"]
            if await release(kube, cluster):
                released += 1
                print(f"released {meta['namespace']}/{meta['name']}: it serves on, unmanaged")
        print(
            f"ok   {released} of {len(clusters)} VLLMClusters released; delete one "
            "(kubectl delete vllmcluster NAME) to remove its fleet"
        )
        return 0
    except (ApiError, OSError) as error:
        print(f"FAIL {error}")
        return 1
    finally:
        await kube.close()


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_release(args))
