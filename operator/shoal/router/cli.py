"""`shoal router`: the command line the operator's router Deployment runs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

import uvloop

from shoal.api.router import RouterPolicy
from shoal.apiserver import quiet_request_log
from shoal.router.app import Discovery, Router, serve
from shoal.router.config import RouterConfig
from shoal.router.keys import KeyFile, KeyFileError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "router", help="run the cache-aware OpenAI router in front of vLLM replicas"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000, help="default 8000, as vLLM's own")
    parser.add_argument("--config", type=Path, help="router.json (spec.router serialised)")
    parser.add_argument(
        "--policy", choices=[p.value for p in RouterPolicy], help="overrides the policy in --config"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--endpoints", help="static replica URLs, comma separated")
    source.add_argument(
        "--kubernetes", action="store_true", help="discover the leader pods by label"
    )
    parser.add_argument("--namespace", help="namespace of the pods (with --kubernetes)")
    parser.add_argument("--selector", help="label selector of the leader pods")
    parser.add_argument("--engine-port", type=int, default=8000)
    peers = parser.add_mutually_exclusive_group()
    peers.add_argument(
        "--peers",
        help="the other router replicas' internal URLs (http://host:internalPort), comma "
        "separated, whose placements this router reads (sharePlacements)",
    )
    peers.add_argument(
        "--peer-selector",
        help="label selector of the other router replicas' pods (with --kubernetes)",
    )
    parser.add_argument(
        "--pod-name",
        default=os.environ.get("POD_NAME"),
        help="this router's pod, left out of --peer-selector's (default: $POD_NAME)",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        help="accepted API keys, one per line (overrides apiKeyFile in --config)",
    )
    parser.add_argument(
        "--engine-key-file",
        type=Path,
        help="key sent to engines, first line (overrides engineKeyFile in --config)",
    )
    parser.add_argument(
        "--serve-internal",
        action="store_true",
        help="serve the internal port (internalPort in --config) even without hot prefixes "
        "or peers: /health, /ready and /metrics there are apart from the clients' "
        "connections and their bound (kubelet's probes, the operator's reads)",
    )
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    quiet_request_log()
    config = RouterConfig.load(args.config)
    if args.policy:
        config = config.model_copy(update={"policy": RouterPolicy(args.policy)})
    if args.kubernetes and not (args.namespace and args.selector):
        raise SystemExit("--kubernetes needs --namespace and --selector")
    if args.peer_selector and not (args.kubernetes and args.pod_name):
        raise SystemExit("--peer-selector needs --kubernetes and --pod-name (or $POD_NAME)")
    discovery = Discovery(
        endpoints=[u for u in (args.endpoints or "").split(",") if u],
        namespace=args.namespace,
        selector=args.selector,
        engine_port=args.engine_port,
        peers=[u for u in (args.peers or "").split(",") if u],
        peer_selector=args.peer_selector,
        pod_name=args.pod_name,
    )
    key_path = args.api_key_file or config.api_key_file
    engine_key_path = args.engine_key_file or config.engine_key_file
    try:
        key_file = KeyFile(Path(key_path)) if key_path else None
        engine_key_file = KeyFile(Path(engine_key_path)) if engine_key_path else None
    except KeyFileError as error:
        raise SystemExit(str(error)) from error
    # uvloop: the router relays ~10k stream chunks a second at 256 streams,
    # and the event loop's own cost is most of its per-chunk cost.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        router = Router(config, discovery, key_file, engine_key_file=engine_key_file)
        runner.run(serve(router, host=args.host, port=args.port, internal=args.serve_internal))
    return 0
