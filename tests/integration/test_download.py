"""`shoal download` (the model cache's Job) against a Hub on loopback: it
fetches the model's files but the original checkpoint, a second run fetches
nothing, a missing file is fetched alone, and a gated model without a token
fails with one line naming the Secret to set; while it runs it serves its
progress (bytes of the total, rising) on GET /progress. A Hub model fetched
into a Hugging Face cache (what vLLM does with a node cache; the simulator
plays it) lands at huggingface_hub's paths, and only once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from shoal.download.hfcache import snapshot
from shoal.download.hub import Hub, HubError
from shoal.download.progress import Progress, from_json
from shoal.procs import free_port, wait_until
from tests.fake_hub import COMMIT, FakeHub, serve_hub, tiny_model_files

REPO = "org/tiny"


def download_env(hub: FakeHub, *, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    env["HF_ENDPOINT"] = hub.url
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def argv(directory: Path, *, port: int = 0) -> list[str]:
    return [
        *(sys.executable, "-m", "shoal.cli", "download", "--repo", REPO),
        *("--dir", str(directory), "--host", "127.0.0.1", "--progress-port", str(port)),
    ]


def download(
    hub: FakeHub, directory: Path, *, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(directory),
        env=download_env(hub, token=token),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_model_is_downloaded_once_and_a_second_run_fetches_nothing(tmp_path: Path) -> None:
    files = tiny_model_files()
    with serve_hub(FakeHub(REPO, files)) as hub:
        first = download(hub, tmp_path)
        assert first.returncode == 0, first.stderr
        assert {p: (tmp_path / p).read_bytes() for p in files if not p.startswith("original/")} == {
            p: b for p, b in files.items() if not p.startswith("original/")
        }
        assert not (tmp_path / "original").exists()
        assert (tmp_path / ".shoal-complete").read_text().strip() == COMMIT
        assert sum(hub.served.values()) == 3
        second = download(hub, tmp_path)
        assert second.returncode == 0, second.stderr
        assert sum(hub.served.values()) == 3  # nothing fetched again


def test_a_missing_or_partial_file_is_fetched_alone(tmp_path: Path) -> None:
    with serve_hub(FakeHub(REPO, tiny_model_files())) as hub:
        assert download(hub, tmp_path).returncode == 0
        (tmp_path / "model.safetensors").write_bytes(b"half")
        assert download(hub, tmp_path).returncode == 0
        assert hub.served["model.safetensors"] == 2 and hub.served["config.json"] == 1
        assert (tmp_path / "model.safetensors").read_bytes() == tiny_model_files()[
            "model.safetensors"
        ]


def test_a_gated_model_without_a_token_fails_naming_the_token_secret(tmp_path: Path) -> None:
    with serve_hub(FakeHub(REPO, tiny_model_files(), token="hf_secret")) as hub:
        refused = download(hub, tmp_path)
        assert refused.returncode == 1
        last = refused.stderr.strip().splitlines()[-1]
        assert "401" in last and "spec.model.source.hf.tokenSecret" in last
        assert not (tmp_path / ".shoal-complete").exists()
        assert download(hub, tmp_path, token="hf_secret").returncode == 0


def test_while_it_runs_the_download_serves_its_bytes_rising_to_the_total(tmp_path: Path) -> None:
    files = tiny_model_files(weight_bytes=4 << 20)
    total = sum(len(b) for name, b in files.items() if not name.startswith("original/"))
    port = free_port()
    seen: list[Progress] = []

    def look() -> bool:
        try:
            found = from_json(httpx.get(f"http://127.0.0.1:{port}/progress", timeout=2).json())
        except (httpx.HTTPError, ValueError):
            found = None
        if found is not None and (not seen or seen[-1].bytes != found.bytes):
            seen.append(found)
        return running.poll() is not None

    with serve_hub(FakeHub(REPO, files, bytes_per_second=1 << 20)) as hub:
        running = subprocess.Popen(argv(tmp_path, port=port), env=download_env(hub))
        try:
            wait_until(look, what="the download to end", timeout=60, interval=0.2)
        finally:
            running.kill()
            running.wait()
    assert running.returncode == 0
    partial = [p.bytes for p in seen if 0 < p.bytes < total]
    assert len(partial) >= 2 and partial == sorted(partial), seen
    assert {p.total_bytes for p in seen} == {total}
    assert seen[-1].bytes_per_second > 0  # a rate once it has run a while
    assert seen[-1].total_files == 3


def test_a_hub_model_lands_in_the_hf_cache_at_its_commit_once(tmp_path: Path) -> None:
    files = tiny_model_files()
    with serve_hub(FakeHub(REPO, files)) as hub, Hub(token=None, base=hub.url) as client:
        directory, fetched = snapshot(client, repo=REPO, revision="main", hf_home=tmp_path)
        repo_dir = tmp_path / "hub" / "models--org--tiny"
        assert directory == repo_dir / "snapshots" / COMMIT
        assert fetched == 3 and (directory / "config.json").read_bytes() == files["config.json"]
        assert (repo_dir / "refs" / "main").read_text() == COMMIT
        assert snapshot(client, repo=REPO, revision="main", hf_home=tmp_path) == (directory, 0)
        assert sum(hub.served.values()) == 3 and hub.listings == 2


def test_a_revision_that_climbs_out_of_the_cache_writes_nothing(tmp_path: Path) -> None:
    """The revision names refs/<revision>. One that normalizes, as a URL, to
    the listing's own path was answered by the Hub, and its ref was written
    five directories above refs/ (at /api/models/... when tried on this machine)."""
    climbing = "../../../../../api/models/org/tiny/revision/main"
    home = tmp_path / "a" / "b" / "home"
    with (
        serve_hub(FakeHub(REPO, tiny_model_files())) as hub,
        Hub(token=None, base=hub.url) as client,
    ):
        with pytest.raises(HubError, match=r"without '\.\.'"):
            snapshot(client, repo=REPO, revision=climbing, hf_home=home)
        assert hub.listings == 0
    assert not (tmp_path / "a" / "api").exists() and not (tmp_path / "api").exists()


def test_a_listing_naming_files_outside_the_model_directory_fetches_nothing(
    tmp_path: Path,
) -> None:
    """A Hub is a server on the network (HF_ENDPOINT may name any mirror):
    a file listed at an absolute path was written there, outside the cache."""
    outside = tmp_path / "outside" / "pwned.txt"
    for name in (str(outside), "a/../../escaped.txt", "", "."):
        files = {**tiny_model_files(), name: b"pwned"}
        directory = tmp_path / "models"
        with serve_hub(FakeHub(REPO, files)) as hub:
            refused = download(hub, directory)
        assert refused.returncode == 1, (name, refused.stderr)
        last = refused.stderr.strip().splitlines()[-1]
        assert "listing" in last and "Traceback" not in refused.stderr, refused.stderr
        assert not outside.exists() and sum(hub.served.values()) == 0


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"sha": "abc", "siblings": 5}',
        b'{"sha": "abc", "siblings": [{"rfilename": "a", "size": 1e999}]}',
        b'{"sha": "abc", "siblings": [{"rfilename": "a", "size": -1}]}',
        b'{"sha": "abc", "siblings": [{"rfilename": "a", "size": "big"}]}',
        b'{"sha": "abc", "siblings": [{"rfilename": 7, "size": 1}]}',
        b'{"sha": "../../x", "siblings": [{"rfilename": "a", "size": 1}]}',
        b"[" * 100_000 + b"]" * 100_000,
        b"not json",
    ],
    ids=[
        "a list",
        "siblings not a list",
        "infinite size",
        "negative size",
        "size not a number",
        "name not a string",
        "commit not a commit",
        "nested too deep",
        "not json",
    ],
)
def test_a_listing_that_is_not_one_fails_the_download_with_a_clear_error(
    tmp_path: Path, body: bytes
) -> None:
    with serve_hub(FakeHub(REPO, tiny_model_files(), listing_body=body)) as hub:
        refused = download(hub, tmp_path)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr
    assert "listing" in refused.stderr.strip().splitlines()[-1], refused.stderr
    assert sum(hub.served.values()) == 0
