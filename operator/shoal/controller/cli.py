"""`shoal operator`: run the VLLMCluster operator (kopf) with shoal's settings."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import socket
from urllib.parse import urlsplit

import kopf
from prometheus_client import start_http_server

from shoal import __version__
from shoal.apiserver import quiet_request_log
from shoal.controller.context import ControllerSettings, OperatorContext
from shoal.controller.handlers import build_registry, build_settings
from shoal.controller.kube import ApiError, KubeApi
from shoal.controller.leading import (
    ApiWait,
    lease_wait,
    run_holding,
    stop_on_signals,
    wait_to_lead,
    waiting_liveness,
)
from shoal.controller.lease import LeaseLock, LeaseLost, own_identity
from shoal.controller.metrics import OperatorMetrics
from shoal.controller.recorder import EventRecorder

log = logging.getLogger("shoal.controller")

DEFAULT_ROUTER_IMAGE = f"ghcr.io/shoal-dev/shoal:{__version__}"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _port(text: str) -> int:
    """A TCP port, or 0 (none)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return port


def _liveness_port(url: str) -> int:
    """The port kopf's liveness server binds for a URL (80 when it names none)."""
    return urlsplit(url).port or 80


def _liveness(text: str) -> str:
    """An http:// URL kopf can serve its liveness probe at."""
    try:
        parts = urlsplit(text)
        _liveness_port(text)  # a port out of range raises
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL like http://0.0.0.0:8080/healthz")
    return text


def _lease(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME")
    return namespace, name


def port_clash(args: argparse.Namespace) -> str | None:
    """Why the liveness and metrics servers cannot both bind, or None."""
    if args.liveness and args.metrics_port == _liveness_port(args.liveness):
        return (
            f"--metrics-port {args.metrics_port} is --liveness's port too; "
            "the second server could not bind it: give each its own"
        )
    return None


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the operator that turns VLLMClusters into engines and a router",
        description="Reconcile VLLMClusters: TP-group StatefulSets per replica, the router, "
        "status. Runs kopf standalone unless kopf's peering resources are installed.",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable; globs like 'team-*'); default: all namespaces",
    )
    parser.add_argument(
        "--router-image",
        default=os.environ.get("SHOAL_ROUTER_IMAGE", DEFAULT_ROUTER_IMAGE),
        help="image of the router pods (default: $SHOAL_ROUTER_IMAGE or %(default)s)",
    )
    parser.add_argument(
        "--router-image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="an image pull Secret for the router pods (repeatable); it must exist in each "
        "VLLMCluster's namespace, as pull Secrets are read from the pod's own",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="never use kopf peering, even when its resources are installed",
    )
    parser.add_argument(
        "--lease",
        type=_lease,
        metavar="NS/NAME",
        help="act only while holding this coordination.k8s.io Lease (made if missing), "
        "so that one operator acts at a time: others wait and take over when it goes",
    )
    parser.add_argument(
        "--liveness",
        type=_liveness,
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=0,
        help="serve the operator's Prometheus metrics on this port (0: off)",
    )
    parser.add_argument("--metrics-host", default="0.0.0.0")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    parser.set_defaults(func=functools.partial(run, parser))


async def peering_installed(kube: KubeApi, *, clusterwide: bool) -> bool:
    """Whether kopf's peering resources are served (kopf.dev/v1)."""
    wanted = "clusterkopfpeerings" if clusterwide else "kopfpeerings"
    try:
        served = await kube.resource_names("kopf.dev/v1")
    except ApiError as error:
        if error.status != 404:
            log.warning("cannot tell whether kopf peering is installed: %s", error)
        return False
    return wanted in served


def start_servers(args: argparse.Namespace, metrics: OperatorMetrics) -> None:
    """Start the metrics server, and see that kopf will be able to bind the liveness
    address (it binds it among its own tasks, where a failure ends in a traceback).
    Raises OSError naming the flag."""
    flag, host, port = "--liveness", "", 0
    try:
        if args.liveness:
            parts = urlsplit(args.liveness)
            host, port = parts.hostname or "", _liveness_port(args.liveness)
            with socket.create_server((host, port)):
                pass
        if args.metrics_port:
            flag, host, port = "--metrics-port", args.metrics_host, args.metrics_port
            start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as error:
        # The errno's own words: create_server adds the address to strerror.
        reason = os.strerror(error.errno) if error.errno and error.errno > 0 else str(error)
        raise OSError(f"{flag}: cannot listen on {host}:{port}: {reason}") from None


async def operate(args: argparse.Namespace, metrics: OperatorMetrics) -> None:
    settings = ControllerSettings(
        router_image=args.router_image,
        router_pull_secrets=tuple(args.router_image_pull_secret),
        namespaces=tuple(args.namespace),
    )
    kube = KubeApi()
    recorder = EventRecorder(kube, counted=metrics.event_posted)
    ctx = OperatorContext(
        settings=settings,
        kube=kube,
        post_event=recorder.post,
        record_event=recorder.record,
        metrics=metrics,
    )
    namespaces = list(settings.namespaces)
    clusterwide = not namespaces
    stop = stop_on_signals()
    api = ApiWait()
    lock: LeaseLock | None = None
    identity = own_identity()
    # kopf names itself from POD_ID, else from getpass.getuser(), which raises
    # for a UID with no passwd entry (a chosen runAsUser, OpenShift's UIDs).
    os.environ.setdefault("POD_ID", identity)
    async with waiting_liveness(args.liveness, lambda: lease_wait(lock) if lock else str(api)):
        standalone = args.standalone
        if not standalone:
            installed = await api.answer(
                functools.partial(peering_installed, kube, clusterwide=clusterwide), stop
            )
            if installed is None:
                return
            standalone = not installed
        log.info(
            "shoal operator %s: %s, %s",
            __version__,
            "all namespaces" if clusterwide else f"namespaces {', '.join(namespaces)}",
            "standalone" if standalone else "with kopf peering",
        )
        if args.lease is not None:
            lock = LeaseLock(kube, *args.lease, identity=identity)
            if not await wait_to_lead(lock, stop):
                return
    operator = functools.partial(
        kopf.operator,
        registry=build_registry(),
        settings=build_settings(standalone=standalone),
        clusterwide=clusterwide,
        namespaces=namespaces,
        memo=kopf.Memo(shoal=ctx),
        liveness_endpoint=args.liveness,
        stop_flag=stop,
    )
    metrics.leading.set(1)
    if lock is None:
        await operator()
        return
    try:
        await run_holding(lock, operator)
    finally:
        metrics.leading.set(0)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if (clash := port_clash(args)) is not None:
        parser.error(clash)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    quiet_request_log()
    metrics = OperatorMetrics()
    try:
        start_servers(args, metrics)
    except OSError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    try:
        asyncio.run(operate(args, metrics))
    except LeaseLost as error:
        # Stopped at once, before any candidate may take it; kubelet restarts
        # the container, which waits its turn as a new candidate.
        log.error("%s: stopped so that one operator acts at a time", error)
        return 1
    return 0
