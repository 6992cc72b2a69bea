"""The generated CRD on a real API server: admission refuses the bad samples the
schema and CEL can judge, naming the field; the good samples are stored with the
models' defaults; kubectl explain, get and scale work as a user expects."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.api.capacity import plan_spec
from shoal.api.crd import CRD_NAME, CRD_PATHS
from shoal.api.resource import VLLMCluster
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import CapacityStatus, Condition, ReplicaStatus, VLLMClusterStatus
from shoal.cli import main
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import get_json, namespace, wait_for
from tests.sample_manifests import SAMPLES, bad_samples, good_samples, load

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crd(testbed: Testbed) -> Iterator[None]:
    """The committed CRD applied as a user would, and served (explain works)."""
    testbed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_PATHS[0]))
    testbed.wait_crd_established(CRD_NAME)
    wait_for(
        lambda: testbed.kubectl("explain", "vllmcluster.spec", check=False),
        what="the VLLMCluster schema published to kubectl explain",
        timeout=60,
    )
    yield


def refusal(bed: Testbed, ns: str, text: str) -> str | None:
    """kubectl apply's error for a manifest, or None when it was accepted."""
    try:
        bed.kubectl("apply", "-n", ns, "-f", "-", input_text=text)
    except RuntimeError as error:
        return str(error)
    return None


def test_bad_samples_are_refused_at_admission_naming_the_field(testbed: Testbed, crd: None) -> None:
    samples = [s for s in bad_samples() if s.caught_by == "apiserver"]
    assert samples
    wrong: list[str] = []
    with namespace(testbed, "bad") as ns:
        for sample in samples:
            error = refusal(testbed, ns, sample.text)
            if error is None:
                wrong.append(f"{sample.name}: accepted, but {sample.field} is wrong")
            elif not re.search(rf"(^|[\s\"]){re.escape(sample.field)}($|[\s:\"])", error):
                wrong.append(f"{sample.name}: refused without naming {sample.field}: {error}")
    assert wrong == []


def test_what_admission_cannot_judge_is_caught_by_shoal_plan(
    testbed: Testbed, crd: None, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = [s for s in bad_samples() if s.caught_by == "shoal plan"]
    assert samples
    with namespace(testbed, "plan") as ns:
        for sample in samples:
            testbed.kubectl("apply", "--dry-run=server", "-n", ns, "-f", str(sample.path))
            assert main(["plan", "-f", str(sample.path)]) == 1, sample.name
            assert f"  {sample.field}: " in capsys.readouterr().out, sample.name


def test_good_samples_are_stored_with_the_models_defaults(testbed: Testbed, crd: None) -> None:
    with namespace(testbed, "good") as ns:
        for path in good_samples():
            testbed.kubectl("apply", "-n", ns, "-f", str(path))
            name = load(path)["metadata"]["name"]
            stored = get_json(testbed, "vllmcluster", name, "-n", ns)["spec"]
            expected = VLLMClusterSpec.model_validate(load(path)["spec"]).to_json()
            assert stored == _without_empty(expected), path.name


def test_kubectl_explain_shows_the_models_descriptions(testbed: Testbed, crd: None) -> None:
    spec = testbed.kubectl("explain", "vllmcluster.spec")
    for field in ("model", "replicas", "parallelism", "router", "warmup", "health", "rollout"):
        assert re.search(rf"^\s+{field}\s+<", spec, re.MULTILINE), field
    assert _words(VLLMClusterSpec.model_fields["replicas"].description or "") in _words(spec)
    dcp = testbed.kubectl("explain", "vllmcluster.spec.parallelism.decodeContext")
    assert "Decode-context-parallel size (--decode-context-parallel-size)" in _words(dcp)
    policy = testbed.kubectl("explain", "vllmcluster.spec.router.policy")
    assert "cache-aware" in policy


def test_get_shows_the_printer_columns_and_scale_changes_spec_replicas(
    testbed: Testbed, crd: None
) -> None:
    path = SAMPLES / "good" / "llama-70b-tp8.yaml"
    manifest = load(path)
    name = manifest["metadata"]["name"]
    with namespace(testbed, "columns") as ns:
        testbed.kubectl("apply", "-n", ns, "-f", str(path))
        status = _observed_status(manifest, selector=f"serving.shoal.dev/cluster={name}")
        testbed.kubectl(
            "patch", "vlc", name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip
        header, row = testbed.kubectl("get", "vlc", "-n", ns).splitlines()
        assert header.split() == [
            "NAME", "REPLICAS", "READY", "WARM", "TP", "PP", "MODEL", "POLICY", "STATUS",
            "DESIRED", "CURRENT", "AGE",
        ]  # fmt: skip
        assert row.split()[:8] == [
            name, "2", "2", "1", "8", "1", "/models/Llama-3.1-70B-Instruct", "cache-aware"
        ]  # fmt: skip

        # Nothing shoal writes to status is pruned: the planner's output round-trips.
        stored = get_json(testbed, "vlc", name, "-n", ns)["status"]
        assert stored == status

        testbed.kubectl("scale", f"vlc/{name}", "--replicas=3", "-n", ns)
        assert get_json(testbed, "vlc", name, "-n", ns)["spec"]["replicas"] == 3
        # The scale subresource an HPA reads: replicas from spec, selector from status.
        scale = json.loads(
            testbed.kubectl(
                "get", "--raw",
                f"/apis/serving.shoal.dev/v1alpha1/namespaces/{ns}/vllmclusters/{name}/scale",
            )
        )  # fmt: skip
        assert scale["spec"]["replicas"] == 3
        assert scale["status"] == {"replicas": 2, "selector": status["selector"]}


def _observed_status(manifest: dict[str, object], *, selector: str) -> dict[str, object]:
    """A status as the operator will write it, with the planner's capacity."""
    spec = VLLMCluster.model_validate(manifest).spec
    capacity = plan_spec(spec)
    assert capacity is not None
    status = VLLMClusterStatus(
        observed_generation=1,
        replicas=2,
        ready_replicas=2,
        warm_replicas=1,
        selector=selector,
        endpoint="http://llama-70b-router.default.svc:8000",
        conditions=[
            Condition(
                type="Ready",
                status="True",
                observed_generation=1,
                last_transition_time="2026-11-30T06:00:00Z",
                reason="ReplicasServing",
                message="1 of 2 replicas warm and serving",
            )
        ],
        capacity=CapacityStatus(**capacity.model_dump(), measured=[]),
        replica_statuses=[
            ReplicaStatus(index=0, state="Serving", pods=["llama-70b-r0-0"], gpus=8),
            ReplicaStatus(index=1, state="Warming", pods=["llama-70b-r1-0"], gpus=8),
        ],
    )
    kept = _without_empty(status.to_json())
    assert isinstance(kept, dict)
    return kept


def _without_empty(value: object) -> object:
    # The API server does not store empty lists and maps the models fill in.
    if isinstance(value, dict):
        kept = {key: _without_empty(child) for key, child in value.items()}
        return {key: child for key, child in kept.items() if child not in ({}, [])}
    if isinstance(value, list):
        return [_without_empty(item) for item in value]
    return value


def _words(text: str) -> str:
    return " ".join(text.split())
