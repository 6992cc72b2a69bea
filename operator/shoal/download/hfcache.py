"""A model into a Hugging Face cache directory (HF_HOME), at the paths
huggingface_hub uses: `hub/models--<org>--<name>/snapshots/<commit>/<file>`
and `refs/<revision>` holding the commit. This is what vLLM does with a Hub
id and spec.model.cache.node (HF_HOME on the node): it asks the Hub for the
revision's commit, then fetches only the files the cache lacks. The
simulator plays that load with it on the testbed; the files are written in
place (no blobs/ and symlinks: nothing here deduplicates revisions)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from shoal.download.hub import DEFAULT_EXCLUDE, Hub, HubError, missing, selected
from shoal.schema.names import REVISION


def repo_directory(hf_home: Path, repo: str) -> Path:
    return hf_home / "hub" / f"models--{repo.replace('/', '--')}"


def snapshot(
    hub: Hub,
    *,
    repo: str,
    revision: str,
    hf_home: Path,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    progress: Callable[[int], None] = lambda _size: None,
) -> tuple[Path, int]:
    """(the snapshot's directory, files fetched): only files missing there
    are fetched. HubError when the Hub refuses (the message says what to set)."""
    if not REVISION.holds(revision):
        # It names a file under refs/: one with '..' would land outside the cache.
        raise HubError(f"revision {revision[:80]!r} {REVISION.message}")
    listing = hub.listing(repo, revision)
    root = repo_directory(hf_home, repo)
    directory = root / "snapshots" / listing.commit
    todo = missing(selected(listing.files, exclude), directory)
    for repo_file in todo:
        hub.fetch(repo, listing.commit, repo_file, directory, progress=progress)
    ref = root / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(listing.commit)
    return directory, len(todo)
