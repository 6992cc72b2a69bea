"""The sample VLLMCluster manifests in tests/samples: good ones, and bad ones whose
header says which field is wrong, who catches it, and why:

    # field: spec.parallelism.decodeContext
    # caught-by: apiserver        (the schema or a CEL rule; else "shoal plan")
    # why: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SAMPLES = Path(__file__).parent / "samples"
CAUGHT_BY = ("apiserver", "shoal plan")


@dataclass(frozen=True)
class BadSample:
    path: Path
    field: str
    caught_by: str
    why: str

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def text(self) -> str:
        return self.path.read_text()

    @property
    def manifest(self) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load(self.text)
        return loaded


def good_samples() -> list[Path]:
    return sorted((SAMPLES / "good").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def bad_samples() -> list[BadSample]:
    samples = []
    for path in sorted((SAMPLES / "bad").glob("*.yaml")):
        header = {}
        for line in path.read_text().splitlines():
            if not line.startswith("# "):
                break
            key, _, value = line[2:].partition(": ")
            header[key] = value.strip()
        samples.append(
            BadSample(
                path=path,
                field=header.get("field", ""),
                caught_by=header.get("caught-by", ""),
                why=header.get("why", ""),
            )
        )
    return samples
