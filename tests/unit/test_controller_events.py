"""The Events shoal posts on a VLLMCluster: core v1 Events naming the
cluster (kind, name, uid), as `kubectl describe vlc` lists them, with long
messages kept within the limit at both ends."""

from __future__ import annotations

from shoal.controller.decide import Event, EventReason, EventType
from shoal.controller.events import MAX_MESSAGE, children_made, event_manifest, shortened
from shoal.controller.identity import ClusterRef

REF = ClusterRef(name="fleet", namespace="apps", uid="1234")


def test_an_event_names_the_cluster_it_is_about_and_who_said_it() -> None:
    event = Event(EventType.NORMAL, EventReason.REPLICA_CREATED, "creating replica 1", replica=1)
    manifest = event_manifest(REF, event, now="2026-12-01T16:00:00Z", instance="host-a")
    assert manifest["apiVersion"] == "v1" and manifest["kind"] == "Event"
    assert manifest["metadata"] == {"generateName": "shoal-", "namespace": "apps"}
    assert manifest["involvedObject"] == {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "name": "fleet",
        "namespace": "apps",
        "uid": "1234",
    }
    assert (manifest["type"], manifest["reason"], manifest["message"]) == (
        "Normal",
        "ReplicaCreated",
        "creating replica 1",
    )
    assert manifest["source"] == {"component": "shoal-operator"}
    assert manifest["reportingInstance"] == "host-a"
    assert manifest["firstTimestamp"] == manifest["lastTimestamp"] == "2026-12-01T16:00:00Z"
    assert manifest["count"] == 1


def test_a_long_message_keeps_its_start_and_its_end() -> None:
    message = "start " + "x" * 3000 + " why it failed"
    short = shortened(message)
    assert len(short) == MAX_MESSAGE
    assert short.startswith("start ") and short.endswith(" why it failed") and "..." in short
    assert shortened("short") == "short"


def test_children_count_as_made_once_a_pass_wrote_status_without_refusals() -> None:
    assert not children_made({})
    made = {"observedGeneration": 3, "conditions": [{"type": "SpecValid", "reason": "Valid"}]}
    assert children_made(made)
    refused = {
        "observedGeneration": 3,
        "conditions": [{"type": "SpecValid", "status": "False", "reason": "ChildRefused"}],
    }
    assert not children_made(refused)
