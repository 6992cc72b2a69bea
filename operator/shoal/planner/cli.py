"""`shoal plan`: compare layouts of a model on a GPU, or plan a VLLMCluster manifest."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, get_args

import yaml

from shoal.api import KIND
from shoal.api.capacity import gpu_of, plan_spec, resolve_architecture
from shoal.api.resource import VLLMCluster
from shoal.api.validation import SpecError, parse_cluster, validate_name, validate_spec
from shoal.planner.architecture import Architecture, Attention, KVCacheDtype, WeightDtype
from shoal.planner.layout import Layout, parse_layout
from shoal.planner.plan import GPU, ROUNDING_NOTE, plan
from shoal.planner.presets import PRESET_NAMES, PRESETS, preset_for_model
from shoal.planner.table import describe, render
from shoal.schema.quantity import GiB

EXAMPLE = (
    "example: shoal plan --model meta-llama/Llama-3.1-70B-Instruct --gpu-memory-gib 79.6 "
    "--gpus-per-node 8 --gpu-memory-utilization 0.90 --overhead-gib 3 "
    "--layout tp8 --layout tp4pp2 --layout tp4dp2"
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="estimate weights, KV cache and concurrency of layouts before launch",
        description="Compare layouts (tp/pp/dp/dcp) of a model on a GPU: weights and KV "
        "bytes per token per GPU, KV pool tokens, full-length requests held at once, and "
        "vLLM's start-up rules. With -f, plan a VLLMCluster manifest and report its "
        "validation errors. Exit status: 0 all fit and are valid (without --layout: one "
        "fits), 1 a layout is refused or a manifest invalid, 2 the command cannot run "
        "(bad arguments, a file that is missing or not YAML).",
        epilog=EXAMPLE,
    )
    model = parser.add_argument_group("model (a preset, or the architecture's numbers)")
    model.add_argument("--model", help="Hugging Face id or path; presets are recognised by id")
    model.add_argument("--preset", choices=PRESET_NAMES, help="a known architecture")
    model.add_argument("--layers", type=int)
    model.add_argument("--query-heads", type=int)
    model.add_argument("--kv-heads", type=int, help="1 for MLA")
    model.add_argument("--head-size", type=int, help="for MLA the cached latent size (576)")
    model.add_argument("--parameters", type=_count, help="parameter count, e.g. 70.6e9")
    model.add_argument("--dtype", choices=get_args(WeightDtype), help="weights (bfloat16)")
    model.add_argument("--kv-cache-dtype", choices=get_args(KVCacheDtype), help="auto")
    model.add_argument("--attention", choices=get_args(Attention), help="GQA or MLA")
    model.add_argument("--context-length", type=int, help="the model's maximum context")
    gpu = parser.add_argument_group("GPU")
    gpu.add_argument("--gpu-memory-gib", type=Fraction, default=Fraction(80), help="default 80")
    gpu.add_argument("--gpus-per-node", type=int, default=8, help="default 8")
    gpu.add_argument(
        "--gpu-memory-utilization", type=Fraction, default=Fraction(92, 100), help="default 0.92"
    )
    gpu.add_argument("--overhead-gib", type=Fraction, default=Fraction(3), help="default 3")
    parser.add_argument(
        "--layout",
        action="append",
        type=_layout,
        default=[],
        help="tp8, tp4pp2, tp4dp2, tp8dcp2 (repeatable); default: every layout of one "
        "replica that fits the node",
    )
    parser.add_argument("--max-model-len", type=int, help="default: the model's context length")
    parser.add_argument("--nodes", type=int, help="refuse layouts needing more nodes than this")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("-f", "--filename", help="plan a VLLMCluster manifest (- for stdin)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.filename:
        return _run_manifests(args.filename, args.output)
    arch = _architecture(args)
    if arch is None:
        print(
            "shoal plan: no architecture: give --preset (one of "
            f"{', '.join(PRESET_NAMES)}), a --model whose id a preset knows, or all of "
            "--layers, --query-heads, --kv-heads, --head-size and --parameters",
            file=sys.stderr,
        )
        return 2
    gpu = GPU(
        memory=args.gpu_memory_gib * GiB,
        per_node=args.gpus_per_node,
        utilization=args.gpu_memory_utilization,
        overhead=args.overhead_gib * GiB,
    )
    layouts: list[Layout] = args.layout or fitting_layouts(arch, gpus_per_node=gpu.per_node)
    plans = [
        plan(arch, gpu, layout=layout, max_model_len=args.max_model_len, nodes=args.nodes)
        for layout in layouts
    ]
    max_model_len = plans[0].max_model_len
    if args.output == "json":
        document = {
            "architecture": dataclasses.asdict(arch),
            "gpu": {
                "memory": f"{float(gpu.memory / GiB):g}Gi",
                "perNode": gpu.per_node,
                "utilization": float(gpu.utilization),
                "overhead": f"{float(gpu.overhead / GiB):g}Gi",
            },
            "maxModelLen": max_model_len,
            "note": ROUNDING_NOTE,
            "layouts": [p.to_json() for p in plans],
        }
        print(json.dumps(document, indent=2))
    else:
        print(describe(arch, gpu, max_model_len=max_model_len))
        print()
        print(render(plans))
    # Layouts asked for must all fit; of the default comparison, one is enough.
    fits = all(p.fits for p in plans) if args.layout else any(p.fits for p in plans)
    return 0 if fits else 1


def _architecture(args: argparse.Namespace) -> Architecture | None:
    preset = args.preset or (preset_for_model(args.model) if args.model else None)
    given = {
        "layers": args.layers,
        "query_heads": args.query_heads,
        "kv_heads": args.kv_heads,
        "head_size": args.head_size,
        "parameters": args.parameters,
        "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "attention": args.attention,
        "context_length": args.context_length,
    }
    overrides = {name: value for name, value in given.items() if value is not None}
    if preset is not None:
        return dataclasses.replace(PRESETS[preset], **overrides)
    shape = ("layers", "query_heads", "kv_heads", "head_size", "parameters")
    if not all(name in overrides for name in shape):
        return None
    return Architecture(name=args.model or "custom", **overrides)


def fitting_layouts(arch: Architecture, *, gpus_per_node: int) -> list[Layout]:
    """Every tensor x pipeline layout of one replica within a node whose tensor size
    divides the query heads and divides, or is a multiple of, the KV heads (vLLM's
    rules), smallest first; the table then says which fit in memory."""
    sizes = [size for size in range(1, gpus_per_node + 1) if gpus_per_node % size == 0]
    layouts = [
        Layout(tensor=tp, pipeline=pp)
        for gpus in sizes
        for tp in sizes
        for pp in sizes
        if tp * pp == gpus
        and arch.query_heads % tp == 0
        and (arch.kv_heads % tp == 0 or tp % arch.kv_heads == 0)
        and pp <= arch.layers
    ]
    return layouts or [Layout()]


def _layout(text: str) -> Layout:
    try:
        return parse_layout(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _count(text: str) -> int:
    value = Fraction(text)
    if value.denominator != 1 or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole count")
    return int(value)


def _run_manifests(filename: str, output: str) -> int:
    try:
        text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
        documents = list(_clusters(text))
    except OSError as error:
        print(f"shoal plan: cannot read {filename}: {error.strerror}", file=sys.stderr)
        return 2
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        print(
            f"shoal plan: {filename} is not YAML{line}: {getattr(error, 'problem', error)}; "
            "fix the manifest (kubectl apply --dry-run=client -f shows the same)",
            file=sys.stderr,
        )
        return 2
    reports = [_report(document) for document in documents]
    if not reports:
        print(f"shoal plan: no {KIND} in {filename}", file=sys.stderr)
        return 2
    if output == "json":
        print(json.dumps([report for report, _ in reports], indent=2))
    else:
        print("\n\n".join(lines for _, lines in reports))
    return 0 if all(report["valid"] for report, _ in reports) else 1


def _clusters(text: str) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(text):
        if isinstance(document, dict) and document.get("kind") == KIND:
            yield document


def _report(manifest: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The JSON report of one manifest and its text form."""
    given_name = (manifest.get("metadata") or {}).get("name")
    name = str(given_name or "(unnamed)")
    cluster, errors = parse_cluster(manifest)
    name_errors = validate_name(given_name) if isinstance(given_name, str) else []
    lines = [f"{KIND} {name}"]
    capacity = None
    if cluster is not None:
        errors = validate_spec(cluster.spec)
        capacity = plan_spec(cluster.spec)
        lines += _capacity_lines(cluster, capacity is not None)
        if capacity is not None:
            lines.append(render([capacity]))
    errors = name_errors + errors
    if errors:
        lines.append(f"{name} is invalid:")
        lines += [f"  {error}" for error in errors]
    else:
        lines.append(f"{name} is valid.")
    report = {
        "name": name,
        "valid": not errors,
        "errors": [_error_json(error) for error in errors],
        "capacity": capacity.to_json() if capacity else None,
    }
    return report, "\n".join(lines)


def _capacity_lines(cluster: VLLMCluster, planned: bool) -> list[str]:
    arch = resolve_architecture(cluster.spec.model)
    if not planned or arch is None:
        return [
            "capacity not planned: spec.model.architecture is not given and model.name "
            f"({cluster.spec.model.name}) matches no preset; give a preset or the "
            "architecture's numbers"
        ]
    model_len = cluster.spec.engine.max_model_len or arch.context_length or 0
    return [describe(arch, gpu_of(cluster.spec), max_model_len=model_len), ""]


def _error_json(error: SpecError) -> dict[str, str]:
    return {"field": error.field, "message": error.message, "rule": error.rule}
