"""The `shoal` command. One image serves every part; the subcommand picks it.

Each subcommand lives beside the part it runs and registers itself through an
`add_parser(subparsers)` function that sets `func` (args -> exit code). A
subcommand is listed here only once it works. Only the module of the
subcommand being run is imported: the simulator and the router start many
times in tests and pods, and the operator's and benchmarks' imports (kopf,
matplotlib) would double their start-up time.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from shoal import __version__

# Subcommand -> (module with its add_parser, one line of help), in the order
# `shoal --help` lists them. The help is here so that listing the commands
# imports none of them: the demo's and benchmarks' extras (rich, matplotlib)
# are optional, and `shoal --help` must work without them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("shoal.demo.cli", "simulated engines behind the router, live (needs shoal[bench])"),
    "operator": ("shoal.controller.cli", "run the operator (the chart's Deployment runs it)"),
    "router": ("shoal.router.cli", "run the cache-aware OpenAI router in front of vLLM replicas"),
    "sim": ("shoal.sim.cli", "a vLLM 0.32 simulator that takes vLLM's own flags"),
    "warmup": ("shoal.warmup.cli", "warm one engine's prefix cache and verify it"),
    "probe": ("shoal.health.cli", "the operator's health checks against one engine"),
    "plan": (
        "shoal.planner.cli",
        "capacity planner: does a layout fit? (weights, KV, concurrency)",
    ),
    "download": (
        "shoal.download.cli",
        "download a Hugging Face model into a directory (the model cache's Job)",
    ),
    "crd": ("shoal.api.cli", "write the VLLMCluster CRD from the API models"),
    "bench": ("shoal.bench.cli", "seeded workloads against an OpenAI URL (needs shoal[bench])"),
    "check": ("shoal.check", "what `helm test` runs: operator up, API served"),
    "release": (
        "shoal.release",
        "what `helm uninstall` runs: VLLMClusters freed of shoal's finalizer",
    ),
}


# What the `bench` extra installs (pyproject.toml): the demo's and benchmarks' view.
OPTIONAL_MODULES = frozenset({"rich", "matplotlib"})


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser. Only `only`'s module is imported, to build its own parser; the
    other commands are listed by name and help."""
    parser = argparse.ArgumentParser(
        prog="shoal", description="Run vLLM as data-parallel fleets on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        if name == only:
            importlib.import_module(module).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        parser = build_parser(command)
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] not in OPTIONAL_MODULES:
            raise
        print(
            f"shoal {command}: needs {missing.name}, which is not installed: "
            "pip install 'shoal[bench]'",
            file=sys.stderr,
        )
        return 2
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
