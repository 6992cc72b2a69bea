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

# Subcommand -> module with its add_parser, in the order `shoal --help` lists them.
COMMANDS: dict[str, str] = {
    "demo": "shoal.demo.cli",
    "operator": "shoal.controller.cli",
    "router": "shoal.router.cli",
    "sim": "shoal.sim.cli",
    "warmup": "shoal.warmup.cli",
    "probe": "shoal.health.cli",
    "plan": "shoal.planner.cli",
    "crd": "shoal.api.cli",
    "bench": "shoal.bench.cli",
    "check": "shoal.check",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that subcommand's module is imported."""
    parser = argparse.ArgumentParser(
        prog="shoal", description="Run vLLM as data-parallel fleets on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
