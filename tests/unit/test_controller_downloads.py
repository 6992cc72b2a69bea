"""prepare_model on a fake API server: a download that completed is done
only while its Job is the one the spec asks for and its claim is there."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from shoal.api.cache import DownloadState
from shoal.controller.desired import manifest_hash
from shoal.controller.downloads import prepare_model
from shoal.controller.identity import Manifest
from shoal.controller.names import ANNOTATION_SPEC_HASH
from shoal.engine.client import EngineClient
from tests.unit.controller_samples import REF, ROUTER_IMAGE
from tests.unit.test_controller_cache import cached

COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}


class _Api:
    """Objects by (kind, name); deletes recorded."""

    def __init__(self, objects: dict[tuple[str, str], Manifest]) -> None:
        self.objects = objects
        self.deleted: list[tuple[str, str]] = []

    async def get(self, _: str, kind: str, __: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def list(self, *_: Any) -> list[Manifest]:
        return []

    async def delete(self, _: str, kind: str, __: str, name: str, **___: Any) -> None:
        self.deleted.append((kind, name))
        self.objects.pop((kind, name), None)


def _stamped(manifest: Manifest, **status: Any) -> Manifest:
    made = copy.deepcopy(manifest)
    made.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = (
        manifest_hash(manifest)
    )
    made["status"] = status
    return made


def _prepare(api: _Api, spec: Any) -> tuple[Any, list[Manifest]]:
    applied: list[Manifest] = []

    async def apply(manifest: Manifest) -> bool:
        applied.append(manifest)
        api.objects[(manifest["kind"], manifest["metadata"]["name"])] = _stamped(manifest)
        return True

    async def run() -> Any:
        async with EngineClient() as engine:
            return await prepare_model(
                api,  # type: ignore[arg-type]
                REF,
                spec,
                image=ROUTER_IMAGE,
                pull_secrets=(),
                apply=apply,
                engine=engine,
            )

    return asyncio.run(run()), applied


def test_a_completed_download_whose_claim_is_gone_or_changed_runs_again() -> None:
    spec = cached({"shared": {"size": "100Gi"}})
    api = _Api({})
    _, applied = _prepare(api, spec)
    job = next(m for m in applied if m["kind"] == "Job")
    claim = next(m for m in applied if m["kind"] == "PersistentVolumeClaim")
    api.objects[("Job", job["metadata"]["name"])] = _stamped(job, **COMPLETE)

    done, applied = _prepare(api, spec)
    assert done.state is DownloadState.COMPLETE and not applied and not api.deleted

    # The claim deleted (by hand, or with its namespace's cleanup): the model
    # is gone with it, so it is made again and the Job runs again.
    del api.objects[("PersistentVolumeClaim", claim["metadata"]["name"])]
    _, applied = _prepare(api, spec)
    assert [m["kind"] for m in applied] == ["PersistentVolumeClaim"], applied
    assert api.deleted == [("Job", job["metadata"]["name"])]
    _, applied = _prepare(api, spec)  # the next pass makes it again
    assert [m["kind"] for m in applied] == ["Job"]

    # The spec now names another claim: the completed Job filled the old one.
    api.objects[("Job", job["metadata"]["name"])] = _stamped(job, **COMPLETE)
    api.deleted.clear()
    moved = cached({"shared": {"claimName": "models"}})
    _, applied = _prepare(api, moved)
    assert api.deleted == [("Job", job["metadata"]["name"])] and not applied
    _, applied = _prepare(api, moved)
    assert [m["kind"] for m in applied] == ["Job"]
