"""kopf runs with shoal's names: its finalizer and annotations on the
project's domain, and a user's `serving.shoal.dev/paused` annotation counts
as a change of the cluster (so pausing and resuming take effect at once)."""

from __future__ import annotations

import asyncio
from typing import cast

import kopf

from shoal.controller.cli import peering_installed
from shoal.controller.handlers import build_settings
from shoal.controller.kube import ApiError, KubeApi


def test_kopf_uses_the_projects_finalizer_and_annotation_domain() -> None:
    settings = build_settings(standalone=True)
    assert settings.persistence.finalizer == "serving.shoal.dev/finalizer"
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, kopf.AnnotationsDiffBaseStorage)
    assert storage.prefix.endswith("serving.shoal.dev")
    assert settings.peering.standalone is True
    assert build_settings(standalone=False).peering.standalone is False


def test_the_paused_annotation_is_part_of_what_kopf_compares() -> None:
    storage = build_settings(standalone=True).persistence.diffbase_storage
    body = kopf.Body(
        {
            "apiVersion": "serving.shoal.dev/v1alpha1",
            "kind": "VLLMCluster",
            "metadata": {
                "name": "c",
                "annotations": {
                    "serving.shoal.dev/paused": "true",
                    # Marks kopf's own prefix, as a handled cluster carries it.
                    f"{storage.prefix}/last-handled-configuration": "{}",  # type: ignore[attr-defined]
                },
            },
            "spec": {"replicas": 1},
        }
    )
    essence = storage.build(body=body)
    assert essence["metadata"]["annotations"] == {"serving.shoal.dev/paused": "true"}


class _Discovery:
    """Answers GET /apis/kopf.dev/v1 as an API server would."""

    def __init__(self, resources: list[str] | None) -> None:
        self.resources = resources

    async def resource_names(self, group_version: str) -> list[str]:
        assert group_version == "kopf.dev/v1"
        if self.resources is None:
            raise ApiError(404, "the server could not find the requested resource")
        return self.resources


def test_kopf_runs_standalone_unless_its_peering_resources_are_installed() -> None:
    def installed(resources: list[str] | None, *, clusterwide: bool) -> bool:
        kube = cast(KubeApi, _Discovery(resources))
        return asyncio.run(peering_installed(kube, clusterwide=clusterwide))

    assert installed(None, clusterwide=True) is False
    assert installed(["clusterkopfpeerings", "kopfpeerings"], clusterwide=True) is True
    assert installed(["kopfpeerings"], clusterwide=True) is False
    assert installed(["kopfpeerings"], clusterwide=False) is True
