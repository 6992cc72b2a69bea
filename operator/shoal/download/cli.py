"""`shoal download`: a Hub model into a directory (what the model cache's Job runs)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import httpx

from shoal.download.hub import (
    COMPLETE_MARKER,
    DEFAULT_EXCLUDE,
    Hub,
    HubError,
    missing,
    selected,
)

log = logging.getLogger("shoal.download")
# A progress line at most this often (the Job's log is how a human follows it).
PROGRESS_SECONDS = 10.0
GiB = 1 << 30


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "download",
        help="download a Hugging Face model into a directory (the model cache's Job)",
        description="Fetch the files of a Hub repository at a revision into --dir, skipping "
        "files already there at their full size, then write .shoal-complete. Reads HF_TOKEN "
        "and HF_ENDPOINT as huggingface_hub does. Exit 0: complete; 1: the Hub refused or "
        "failed (the last line says what to change); 2: bad arguments.",
    )
    parser.add_argument("--repo", required=True, help="e.g. meta-llama/Llama-3.1-8B-Instruct")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (main)")
    parser.add_argument("--dir", type=Path, required=True, help="where the files go")
    parser.add_argument(
        "--exclude",
        action="append",
        default=None,
        metavar="GLOB",
        help=f"skip files matching GLOB (repeatable; default {' '.join(DEFAULT_EXCLUDE)})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    exclude = tuple(args.exclude) if args.exclude is not None else DEFAULT_EXCLUDE
    directory: Path = args.dir
    try:
        with Hub(token=os.environ.get("HF_TOKEN") or None) as hub:
            listing = hub.listing(args.repo, args.revision)
            files = selected(listing.files, exclude)
            todo = missing(files, directory)
            total = sum(f.size for f in todo)
            log.info(
                "%s@%s: %d files, %.2f GiB; %d to fetch (%.2f GiB) into %s",
                args.repo,
                listing.commit,
                len(files),
                sum(f.size for f in files) / GiB,
                len(todo),
                total / GiB,
                directory,
            )
            done = 0
            last = time.monotonic()

            def progress(size: int) -> None:
                nonlocal done, last
                done += size
                if time.monotonic() - last >= PROGRESS_SECONDS:
                    last = time.monotonic()
                    share = 100 * done / total if total else 100.0
                    log.info("fetched %.2f of %.2f GiB (%.0f%%)", done / GiB, total / GiB, share)

            for repo_file in todo:
                hub.fetch(args.repo, listing.commit, repo_file, directory, progress=progress)
            (directory / COMPLETE_MARKER).write_text(listing.commit + "\n")
    except HubError as error:
        print(f"shoal download: {error}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, OSError) as error:
        print(f"shoal download: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    log.info("%s@%s complete in %s", args.repo, listing.commit, directory)
    return 0
