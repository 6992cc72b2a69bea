"""The real node's images (hack/shoal_testbed/noderun.py): an archive's image
ID is its config's digest, and an image is imported again when containerd
holds its name at another ID (a rebuilt :dev image), not only when the name
is missing."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from shoal_testbed.noderun import archive_image_id, stale_images

CONFIG = "768babba11689f762a75a2e71c644c483009912a8bedb196611c2d1a62c8f0fa"


def docker_archive(path: Path, *, config: str, tag: str) -> Path:
    manifest = json.dumps([{"Config": f"{config}.json", "RepoTags": [tag], "Layers": []}])
    with tarfile.open(path, "w") as tar:
        for name, body in ((f"{config}.json", b"{}"), ("manifest.json", manifest.encode())):
            member = tarfile.TarInfo(name)
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
    return path


def test_an_archives_image_id_is_its_configs_digest(tmp_path: Path) -> None:
    archive = docker_archive(tmp_path / "shoal.tar", config=CONFIG, tag="localhost/shoal:dev")
    assert archive_image_id(archive) == f"sha256:{CONFIG}"


def test_a_rebuilt_image_under_the_same_name_is_imported_again() -> None:
    wanted = {"localhost/shoal:dev": "sha256:new", "localhost/shoal-pause:v1": "sha256:p"}
    present = {"localhost/shoal:dev": "sha256:old", "localhost/shoal-pause:v1": "sha256:p"}
    assert stale_images(wanted, present) == ["localhost/shoal:dev"]


def test_a_missing_image_is_imported_and_an_identical_one_is_not() -> None:
    wanted = {"localhost/shoal:dev": "sha256:a", "localhost/shoal-engine-sim:dev": "sha256:b"}
    assert stale_images(wanted, {"localhost/shoal:dev": "sha256:a"}) == [
        "localhost/shoal-engine-sim:dev"
    ]
    assert stale_images(wanted, dict(wanted)) == []
