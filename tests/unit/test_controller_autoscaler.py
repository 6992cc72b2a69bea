"""The built-in autoscaler's round against a fake API server: the removal
order it writes names the count it sets, so the reconciler follows it for
that scale and for no other; standing aside (an HPA, a ScaledObject) it
takes its order away; a restarted operator keeps the last scale's time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from shoal.controller.autoscaler import AutoscalerState, autoscale
from shoal.controller.names import ANNOTATION_REMOVAL_ORDER
from shoal.controller.reconcile import live_indices
from tests.unit.controller_samples import REF, spec_of
from tests.unit.test_controller_decide import desired_for, serving

SCALED_AT = "2025-01-02T03:04:05Z"


@dataclass
class FakeKube:
    """Lists what it is given; records patches."""

    hpas: list[dict[str, Any]] = field(default_factory=list)
    patches: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str, **_: Any
    ) -> list[dict[str, Any]]:
        return self.hpas if kind == "HorizontalPodAutoscaler" else []

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        self.patches.append((body, subresource))
        return {}


def cluster(
    *, replicas: int, annotations: dict[str, str] | None = None, **status: Any
) -> dict[str, Any]:
    # No router answers in these rounds: only the bounds move the count.
    spec = spec_of(
        model={"name": "meta-llama/Llama-3.1-8B-Instruct"},
        replicas=replicas,
        autoscaling={"minReplicas": 1, "maxReplicas": 2},
    )
    meta = {"name": REF.name, "namespace": REF.namespace, "uid": REF.uid, "generation": 1}
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {**meta, "annotations": annotations or {}},
        "spec": spec.to_json(),
        "status": status,
    }


def round_of(kube: FakeKube, body: dict[str, Any]) -> None:
    ctx: Any = SimpleNamespace(kube=kube, post_event=lambda *_: None)
    asyncio.run(autoscale(ctx, body, AutoscalerState()))


def written(kube: FakeKube, part: str) -> list[dict[str, Any]]:
    return [body[part] for body, subresource in kube.patches if part in body]


def test_the_removal_order_is_followed_for_the_scale_it_was_written_for_only() -> None:
    kube = FakeKube()
    # Replica 0 still warmed up when the autoscaler ranked: it goes first.
    statuses = [{"index": 0, "state": "Warming"}] + [
        {"index": i, "state": "Serving"} for i in (1, 2)
    ]
    round_of(kube, cluster(replicas=3, replicaStatuses=statuses))  # above maxReplicas: to 2
    [meta] = written(kube, "metadata")
    annotations = meta["annotations"]
    assert written(kube, "spec") == [{"replicas": 2}]
    observed = serving(range(3), desired_for(3))
    two = spec_of(replicas=2, autoscaling={"minReplicas": 1, "maxReplicas": 2})
    assert live_indices(two, observed, annotations) == [1, 2]
    # An HPA or kubectl scale to 1 afterwards, all serving by then: the
    # ranking was not made for it, so the highest index goes, then the next.
    one = spec_of(replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 2})
    assert live_indices(one, observed, annotations) == [0]


def test_standing_aside_for_an_hpa_takes_the_autoscalers_removal_order_away() -> None:
    hpa = {
        "metadata": {"name": "c"},
        "spec": {"scaleTargetRef": {"kind": "VLLMCluster", "name": REF.name}},
    }
    kube = FakeKube(hpas=[hpa])
    round_of(kube, cluster(replicas=2, annotations={ANNOTATION_REMOVAL_ORDER: "1,0"}))
    assert {"annotations": {ANNOTATION_REMOVAL_ORDER: None}} in written(kube, "metadata")
    assert written(kube, "spec") == []


def test_a_restarted_operator_keeps_the_last_scale_time_it_did_not_make() -> None:
    kube = FakeKube()
    before = {"desiredReplicas": 2, "lastDecision": "ScaledUp", "lastScaleTime": SCALED_AT}
    round_of(kube, cluster(replicas=2, autoscaling=before))
    [status] = written(kube, "status")
    assert status["autoscaling"]["lastScaleTime"] == SCALED_AT
    assert status["autoscaling"]["lastDecision"] == "NoSignal"
