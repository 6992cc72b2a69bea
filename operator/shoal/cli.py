"""The `shoal` command. One image serves every part; the subcommand picks it.

Each subcommand lives beside the part it runs and registers itself through an
`add_parser(subparsers)` function that sets `func` (args -> exit code). A
subcommand is listed here only once it works.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from shoal import __version__
from shoal.api.cli import add_parser as add_crd_parser
from shoal.planner.cli import add_parser as add_plan_parser
from shoal.router.cli import add_parser as add_router_parser
from shoal.sim.cli import add_parser as add_sim_parser

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

# Subcommand registrations, in the order `shoal --help` lists them.
COMMANDS: tuple[Register, ...] = (
    add_router_parser,
    add_sim_parser,
    add_plan_parser,
    add_crd_parser,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal", description="Run vLLM as data-parallel fleets on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
