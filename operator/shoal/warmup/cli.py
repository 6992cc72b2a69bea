"""`shoal warmup`: warm one engine and verify it, as the operator does."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from shoal.engine.client import EngineClient
from shoal.warmup.prompts import Prompt, load_file
from shoal.warmup.runner import WarmupResult, warm
from shoal.warmup.verify import Verdict


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "warmup",
        help="warm one engine's prefix cache and verify it from its own counters",
        description="Send every prompt with max_tokens 1, replay a sample, and compare the "
        "rise of vllm:prefix_cache_hits_total with the hits of fully cached prompts. "
        "Exits non-zero when the ratio is not reached.",
    )
    parser.add_argument("--endpoint", required=True, help="engine URL, e.g. http://10.0.0.5:8000")
    parser.add_argument(
        "--prompts",
        type=Path,
        required=True,
        help="one prompt per line, or JSON objects per line in a .jsonl file "
        '({"prompt": ...} or {"messages": [...]})',
    )
    parser.add_argument("--model", help="served model name (default: the engine's first)")
    parser.add_argument("--min-hit-ratio", type=float, default=0.9)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--output", choices=["text", "json"], default="text")
    parser.set_defaults(func=run)


async def _warm(args: argparse.Namespace, prompts: list[Prompt]) -> WarmupResult:
    async with EngineClient() as engine:
        return await warm(
            args.endpoint,
            prompts,
            engine=engine,
            model=args.model,
            min_hit_ratio=args.min_hit_ratio,
            timeout_seconds=args.timeout,
            concurrency=args.concurrency,
        )


def run(args: argparse.Namespace) -> int:
    try:
        prompts = load_file(args.prompts)
    except (OSError, ValueError) as error:
        raise SystemExit(f"shoal warmup: {args.prompts}: {error}") from error
    if not prompts:
        raise SystemExit(f"shoal warmup: {args.prompts} holds no prompt")
    result = asyncio.run(_warm(args, prompts))
    if args.output == "json":
        print(
            json.dumps(
                {
                    "verdict": result.verdict.value,
                    "promptsSent": result.prompts_sent,
                    "hitRatio": result.hit_ratio,
                    "durationSeconds": round(result.duration_seconds, 3),
                    "rounds": result.rounds,
                    "detail": result.detail,
                }
            )
        )
    else:
        print(result.message)
    return 0 if result.verdict is Verdict.WARM else 1
