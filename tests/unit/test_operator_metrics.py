"""The operator's per-VLLMCluster metrics: replica counts and conditions as
the status says, the alerted Event reasons starting at 0, pass results, and a
forgotten cluster's series gone."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from shoal.controller.metrics import OperatorMetrics

KEY = ("team-a", "llama")


def _status(*, ready: int, warm: int, degraded: str, reason: str) -> dict[str, Any]:
    return {
        "replicas": 3,
        "readyReplicas": ready,
        "warmReplicas": warm,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "ReplicasWarm"},
            {"type": "Degraded", "status": degraded, "reason": reason},
        ],
    }


def _samples(metrics: OperatorMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def test_each_cluster_has_desired_ready_and_warm_replicas_and_its_conditions() -> None:
    metrics = OperatorMetrics()
    metrics.observe_cluster(
        KEY, desired=3, status=_status(ready=2, warm=1, degraded="False", reason="AsExpected")
    )
    found = _samples(metrics)
    labels = 'namespace="team-a",state="{}",vllmcluster="llama"'
    assert found[f"shoal_operator_cluster_replicas{{{labels.format('desired')}}}"] == 3
    assert found[f"shoal_operator_cluster_replicas{{{labels.format('ready')}}}"] == 2
    assert found[f"shoal_operator_cluster_replicas{{{labels.format('warm')}}}"] == 1
    degraded = (
        'shoal_operator_cluster_condition{condition="Degraded",namespace="team-a",'
        'reason="{}",status="{}",vllmcluster="llama"}'
    )
    assert found[degraded.replace("{}", "AsExpected", 1).replace("{}", "False", 1)] == 1


def test_a_condition_that_changes_keeps_one_series_for_its_current_status() -> None:
    metrics = OperatorMetrics()
    metrics.observe_cluster(
        KEY, desired=3, status=_status(ready=3, warm=3, degraded="False", reason="AsExpected")
    )
    metrics.observe_cluster(
        KEY,
        desired=3,
        status=_status(ready=2, warm=2, degraded="True", reason="RestartBudgetExhausted"),
    )
    degraded = [n for n in _samples(metrics) if 'condition="Degraded"' in n]
    assert len(degraded) == 1
    assert 'reason="RestartBudgetExhausted"' in degraded[0] and 'status="True"' in degraded[0]


def test_alerted_event_reasons_start_at_zero_so_the_first_one_is_an_increase() -> None:
    metrics = OperatorMetrics()
    metrics.observe_cluster(
        KEY, desired=1, status=_status(ready=1, warm=1, degraded="False", reason="AsExpected")
    )
    restarted = (
        'shoal_operator_events_total{namespace="team-a",reason="ReplicaRestarted",'
        'type="Warning",vllmcluster="llama"}'
    )
    assert _samples(metrics)[restarted] == 0


def test_a_forgotten_cluster_leaves_no_series_behind() -> None:
    metrics = OperatorMetrics()
    other = ("team-b", "other")
    for key in (KEY, other):
        metrics.observe_cluster(
            key, desired=1, status=_status(ready=1, warm=1, degraded="False", reason="AsExpected")
        )
        metrics.pass_finished(key, ok=True, seconds=0.02)
        metrics.pass_finished(key, ok=False, seconds=0.5)
    metrics.forget(KEY)
    found = _samples(metrics)
    assert not [n for n in found if 'vllmcluster="llama"' in n]
    assert [n for n in found if 'vllmcluster="other"' in n and "reconcile_passes_total" in n]


def test_a_cluster_whose_passes_all_fail_has_its_successes_at_zero() -> None:
    # ShoalOperatorNotReconciling alerts on increase(...{result="ok"}) == 0:
    # a cluster failing from the operator's start had no such series at all,
    # and a missing series is no alert.
    metrics = OperatorMetrics()
    metrics.pass_finished(KEY, ok=False, seconds=0.5)
    found = _samples(metrics)
    labels = 'namespace="team-a",result="{}",vllmcluster="llama"'
    passes = "shoal_operator_reconcile_passes_total{%s}"
    assert found[passes % labels.format("ok")] == 0
    assert found[passes % labels.format("error")] == 1
