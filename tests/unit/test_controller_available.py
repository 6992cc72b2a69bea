"""The Available condition beside Ready: a fleet with one replica restarting
is still Available (what `kubectl wait --for=condition=Available` and GitOps
health checks wait for) while Ready says not every replica is serving; and
the shared model cache's download as status shows it."""

from __future__ import annotations

from typing import Any

from shoal.api.cache import DownloadState
from shoal.controller.cache import Download
from shoal.controller.observe import Observed, ReplicaFacts, RouterFacts
from shoal.controller.status import build_status
from tests.unit.controller_samples import spec_of
from tests.unit.test_controller_decide import pod_for, set_for
from tests.unit.test_controller_status import conditions, inputs


def serving(indices: tuple[int, ...], *, router: int = 1) -> Observed:
    return Observed(
        replicas={
            i: ReplicaFacts(index=i, leader=set_for(i, None), pods=[pod_for(i)]) for i in indices
        },
        router=RouterFacts(spec_hash="h", available=router),
    )


def condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    found = conditions(status)[kind]
    return found["status"], found["reason"]


def test_one_replica_of_three_down_is_available_but_not_ready() -> None:
    status = build_status(inputs(serving((0, 1)), spec=spec_of(replicas=3)))
    assert condition(status, "Ready")[0] == "False"
    assert condition(status, "Available") == ("True", "MinimumReplicasAvailable")
    assert "2 of 3 replicas" in conditions(status)["Available"]["message"]


def test_fewer_serving_replicas_than_min_available_is_not_available() -> None:
    spec = spec_of(replicas=3, minAvailable=3)
    status = build_status(inputs(serving((0, 1)), spec=spec))
    assert condition(status, "Available") == ("False", "MinimumReplicasUnavailable")


def test_min_available_above_replicas_asks_for_every_replica() -> None:
    status = build_status(inputs(serving((0, 1)), spec=spec_of(replicas=2, minAvailable=5)))
    assert condition(status, "Available") == ("True", "MinimumReplicasAvailable")


def test_no_router_pod_means_not_available() -> None:
    status = build_status(inputs(serving((0, 1), router=0), spec=spec_of(replicas=2)))
    assert condition(status, "Available") == ("False", "RouterUnavailable")


def test_zero_replicas_is_not_available() -> None:
    status = build_status(inputs(serving(()), spec=spec_of(replicas=0)))
    assert condition(status, "Available") == ("False", "NoReplicas")


CACHED = {"name": "org/tiny", "cache": {"shared": {}}}


def test_a_running_download_shows_replicas_downloading_and_progressing() -> None:
    running = Download("c-dl-abc", DownloadState.RUNNING, "Job c-dl-abc is downloading")
    status = build_status(
        inputs(serving(()), spec=spec_of(replicas=2, model=CACHED), download=running)
    )
    assert [r["state"] for r in status["replicaStatuses"]] == ["Downloading", "Downloading"]
    assert condition(status, "Progressing") == ("True", "Downloading")
    assert "c-dl-abc" in conditions(status)["Progressing"]["message"]
    assert condition(status, "Degraded")[0] == "False"


def test_a_failed_download_is_degraded_with_the_job_s_words() -> None:
    failed = Download(
        "c-dl-abc",
        DownloadState.FAILED,
        "Job c-dl-abc failed: 401 from Hugging Face: set spec.model.source.hf.tokenSecret",
    )
    status = build_status(
        inputs(serving(()), spec=spec_of(replicas=1, model=CACHED), download=failed)
    )
    assert condition(status, "Degraded") == ("True", "DownloadFailed")
    assert "tokenSecret" in conditions(status)["Degraded"]["message"]
    assert status["replicaStatuses"][0]["state"] == "Downloading"
