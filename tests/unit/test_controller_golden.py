"""Golden files pin the manifests generated for the good samples, so a change
to shoal that would roll running engines (or routers) is seen in review.

After an intended change: SHOAL_UPDATE_GOLDEN=1 pytest tests/unit/test_controller_golden.py,
and call the change out in the release notes if engine templates moved."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal.api.resource import VLLMCluster
from shoal.controller.desired import desired_fleet
from shoal.controller.identity import ClusterRef
from tests.sample_manifests import good_samples, load

GOLDEN = Path(__file__).parent / "golden"
ROUTER_IMAGE = "ghcr.io/shoal-dev/shoal:golden"


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(sample: Path) -> str:
    manifest = load(sample)
    cluster = VLLMCluster.model_validate(manifest)
    ref = ClusterRef(
        name=manifest["metadata"]["name"],
        namespace="default",
        uid="00000000-0000-0000-0000-000000000000",
    )
    fleet = desired_fleet(ref, cluster.spec, router_image=ROUTER_IMAGE)
    return yaml.dump_all(fleet.all(), Dumper=_Dumper, sort_keys=True, width=100)


@pytest.mark.parametrize("sample", good_samples(), ids=lambda p: p.stem)
def test_generated_manifests_match_the_golden_files(sample: Path) -> None:
    golden = GOLDEN / f"{sample.stem}.yaml"
    text = render(sample)
    if os.environ.get("SHOAL_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden.name}: run with SHOAL_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"manifests for {sample.name} changed; if intended, regenerate with "
        "SHOAL_UPDATE_GOLDEN=1 (an engine template change rolls running engines)"
    )
