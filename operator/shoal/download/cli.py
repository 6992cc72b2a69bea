"""`shoal download`: a Hub model into a directory (what the model cache's Job runs)."""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
from shoal.download.progress import PROGRESS_PATH, PROGRESS_PORT, Progress, describe

log = logging.getLogger("shoal.download")
# A progress line at most this often (the Job's log is how a human follows it).
PROGRESS_SECONDS = 10.0
GiB = 1 << 30
# A rate (and so a time left) only after this long: the first instants (a few
# small files, a connection being set up) say nothing about the rest.
RATE_AFTER_SECONDS = 2.0


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
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="address the progress is served on (0.0.0.0: the pod's IP)",
    )
    parser.add_argument(
        "--progress-port",
        type=int,
        default=PROGRESS_PORT,
        help=f"serve GET {PROGRESS_PATH} (bytes done, total, rate) here, 0 for none "
        f"({PROGRESS_PORT}; the operator reads it into status)",
    )
    parser.set_defaults(func=run)


class Meter:
    """The download's progress as it goes, read by the progress server's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress: Progress | None = None  # None while the files are listed
        self._fetched = 0
        self._started = time.monotonic()

    def begin(self, *, present: int, total: int, files: int, total_files: int) -> None:
        with self._lock:
            self._progress = Progress(
                bytes=present, total_bytes=total, files=files, total_files=total_files
            )
            self._fetched, self._started = 0, time.monotonic()

    def add(self, size: int, *, file_done: bool = False) -> None:
        with self._lock:
            self._fetched += size
            elapsed = time.monotonic() - self._started
            current = self._progress
            if current is None:
                return
            self._progress = Progress(
                bytes=current.bytes + size,
                total_bytes=current.total_bytes,
                bytes_per_second=self._fetched / elapsed if elapsed >= RATE_AFTER_SECONDS else 0.0,
                files=current.files + int(file_done),
                total_files=current.total_files,
            )

    def snapshot(self) -> Progress | None:
        with self._lock:
            return self._progress


@contextmanager
def serving(meter: Meter, *, host: str, port: int) -> Iterator[None]:
    """GET /progress answered from meter while the download runs."""
    if port == 0:
        yield
        return

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass  # the operator asks every few seconds; the log is for the download

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != PROGRESS_PATH:
                self.send_error(404)
                return
            progress = meter.snapshot()
            if progress is None:
                self.send_error(503, "listing the repository")
                return
            body = json.dumps(progress.to_json()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    try:
        server = http.server.ThreadingHTTPServer((host, port), Handler)
    except OSError as error:
        # Progress is for status only: the download goes on without it.
        log.warning("not serving progress on %s:%d: %s", host, port, error)
        yield
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    exclude = tuple(args.exclude) if args.exclude is not None else DEFAULT_EXCLUDE
    directory: Path = args.dir
    meter = Meter()
    try:
        with (
            serving(meter, host=args.host, port=args.progress_port),
            Hub(token=os.environ.get("HF_TOKEN") or None) as hub,
        ):
            listing = hub.listing(args.repo, args.revision)
            files = selected(listing.files, exclude)
            todo = missing(files, directory)
            total = sum(f.size for f in files)
            left = sum(f.size for f in todo)
            log.info(
                "%s@%s: %d files, %.2f GiB; %d to fetch (%.2f GiB) into %s",
                args.repo,
                listing.commit,
                len(files),
                total / GiB,
                len(todo),
                left / GiB,
                directory,
            )
            meter.begin(
                present=total - left,
                total=total,
                files=len(files) - len(todo),
                total_files=len(files),
            )
            last = time.monotonic()

            def progress(size: int) -> None:
                nonlocal last
                meter.add(size)
                if time.monotonic() - last >= PROGRESS_SECONDS and (now := meter.snapshot()):
                    last = time.monotonic()
                    log.info("fetched %s", describe(now))

            for repo_file in todo:
                hub.fetch(args.repo, listing.commit, repo_file, directory, progress=progress)
                meter.add(0, file_done=True)
            (directory / COMPLETE_MARKER).write_text(listing.commit + "\n")
    except HubError as error:
        print(f"shoal download: {error}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, OSError) as error:
        print(f"shoal download: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    log.info("%s@%s complete in %s", args.repo, listing.commit, directory)
    return 0
