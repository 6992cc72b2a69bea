"""The Hugging Face Hub's HTTP API, as much as a download needs: the files of a
repository at a revision (GET /api/models/<id>/revision/<rev>?blobs=true) and
each file's bytes (GET /<id>/resolve/<commit>/<path>, which redirects to a CDN).

HF_ENDPOINT (a mirror or an on-premises Hub) and HF_TOKEN are read as
huggingface_hub reads them, so an engine and its download Job given the same
env talk to the same Hub."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

DEFAULT_ENDPOINT = "https://huggingface.co"
# Llama repositories ship the original PyTorch checkpoint beside the
# safetensors vLLM loads (16 GB more for 8B, 810 GB for 405B).
DEFAULT_EXCLUDE = ("original/*",)
# Written last: a directory holding it is complete (its text: the commit).
COMPLETE_MARKER = ".shoal-complete"
# A commit as the Hub names one.
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int


@dataclass(frozen=True)
class Listing:
    commit: str
    files: tuple[RepoFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class HubError(Exception):
    """A download that cannot succeed as configured; the message says what to change."""


def parse_listing(body: Any, *, repo: str, revision: str) -> Listing:
    """The files of a listing, checked: a Hub is a server on the network
    (HF_ENDPOINT may name any mirror), and each name becomes a path written
    under the model's directory, each commit a URL. HubError if not one."""

    def refused(why: str) -> HubError:
        return HubError(f"the Hub's listing of {repo}@{revision} is not one: {why}")

    if not isinstance(body, dict):
        raise refused("not a JSON object")
    commit = body.get("sha") or revision
    if body.get("sha") is not None and not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        raise refused(f"its commit {str(commit)[:60]!r} is not 40 hex digits")
    siblings = body.get("siblings") or []
    if not isinstance(siblings, list):
        raise refused("its siblings are not a list")
    files = []
    for sibling in siblings:
        if not isinstance(sibling, dict):
            raise refused(f"a sibling {str(sibling)[:80]!r} is not an object")
        name, size = sibling.get("rfilename"), sibling.get("size") or 0
        if not isinstance(name, str) or not _relative(name):
            raise refused(f"a file's name {str(name)[:80]!r} is not a path inside the model")
        if type(size) is not int or size < 0:
            raise refused(f"the size of {name[:80]!r} is not a count of bytes: {size!r:.40}")
        files.append(RepoFile(path=name, size=size))
    return Listing(commit=str(commit), files=tuple(files))


def _relative(name: str) -> bool:
    """A path that stays inside the directory it is joined to."""
    parts = PurePosixPath(name).parts
    return (
        bool(parts)
        and "\x00" not in name
        and not PurePosixPath(name).is_absolute()
        and all(part not in ("..", ".") for part in parts)
    )


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def selected(files: Sequence[RepoFile], exclude: Sequence[str]) -> tuple[RepoFile, ...]:
    return tuple(f for f in files if not any(fnmatch.fnmatch(f.path, p) for p in exclude))


def missing(files: Sequence[RepoFile], directory: Path) -> tuple[RepoFile, ...]:
    """Files not yet in directory at their full size."""
    found = []
    for repo_file in files:
        path = directory / repo_file.path
        if not path.is_file() or path.stat().st_size != repo_file.size:
            found.append(repo_file)
    return tuple(found)


def explain(status: int, *, repo: str, revision: str) -> str:
    """What a refusal from the Hub means for the spec."""
    if status == 401:
        return (
            f"401 from Hugging Face for {repo}: the model is gated or private: set "
            "spec.model.source.hf.tokenSecret to a Secret holding a token that may read it"
        )
    if status == 403:
        return (
            f"403 from Hugging Face for {repo}: the token may not read it (accept the "
            "model's licence on its Hub page with the token's account)"
        )
    if status == 404:
        return (
            f"404 from Hugging Face: no repository {repo} at revision {revision}: check "
            "spec.model.source.hf.id (or model.name) and revision"
        )
    return f"the Hub answered {status} for {repo}"


class Hub:
    """One client for the whole download (connection reuse across files)."""

    def __init__(self, *, token: str | None, base: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base = base or endpoint()
        self.client = httpx.Client(
            headers=headers, follow_redirects=True, timeout=httpx.Timeout(60.0, connect=10.0)
        )

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()

    def listing(self, repo: str, revision: str) -> Listing:
        url = f"{self.base}/api/models/{repo}/revision/{revision}"
        response = self.client.get(url, params={"blobs": "true"})
        if response.status_code != 200:
            raise HubError(explain(response.status_code, repo=repo, revision=revision))
        try:
            body = json.loads(response.content)
        except (ValueError, RecursionError) as error:
            raise HubError(f"the Hub's listing of {repo}@{revision} is not JSON") from error
        return parse_listing(body, repo=repo, revision=revision)

    def fetch(
        self,
        repo: str,
        commit: str,
        repo_file: RepoFile,
        directory: Path,
        *,
        progress: Callable[[int], None],
    ) -> None:
        """The file's bytes into directory, through a .incomplete file renamed
        when whole, so a reader never sees half a file under its name."""
        target = directory / repo_file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".incomplete")
        url = f"{self.base}/{repo}/resolve/{commit}/{repo_file.path}"
        with self.client.stream("GET", url) as response:
            if response.status_code != 200:
                raise HubError(explain(response.status_code, repo=repo, revision=commit))
            with partial.open("wb") as out:
                # As the bytes arrive (no re-chunking): the progress follows them.
                for chunk in response.iter_bytes():
                    out.write(chunk)
                    progress(len(chunk))
        partial.replace(target)
