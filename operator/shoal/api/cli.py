"""`shoal crd`: write the generated CRD where the repository and the chart keep it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shoal.api.crd import CRD_PATHS, render_crd


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "crd",
        help="generate the VLLMCluster CRD from the API models",
        description="Write the VLLMCluster CustomResourceDefinition, generated from the "
        f"pydantic models, to {' and '.join(CRD_PATHS)} under --root, or print it.",
    )
    parser.add_argument(
        "--root", type=Path, default=Path(), help="repository root (default: current directory)"
    )
    parser.add_argument("--stdout", action="store_true", help="print the CRD instead of writing")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the files differ from what the models generate",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = render_crd()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    stale = [path for path in CRD_PATHS if _read(args.root / path) != text]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run `make crds`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        target = args.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {path}")
    return 0


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None
