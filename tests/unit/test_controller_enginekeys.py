"""A rotated engine key rolls out like a new template (controller/enginekeys.py):

- each replica's engine templates carry the key's digest, never the key;
- a new key makes every replica outdated, and the rollout replaces them
  within rollout.maxUnavailable (one at a time here), not all at once;
- a Secret that cannot be read now rolls nothing; nor does an operator
  upgrade (replicas made before keys were followed keep their template
  until the first rotation);
- the canary tries each pod's own key first (by its digest), then the
  others it knows.
"""

from __future__ import annotations

import dataclasses
import json

from shoal.controller.decide import Desired, Memory, Probes, decide
from shoal.controller.desired import DesiredFleet, manifest_hash
from shoal.controller.enginekeys import KeyRing, key_digest, with_engine_key
from shoal.controller.names import ANNOTATION_ENGINE_KEY
from shoal.controller.observe import Observed, ReplicaFacts
from tests.unit.controller_samples import fleet_of, spec_of
from tests.unit.test_controller_decide import pod_for, set_for

OLD, NEW = "sk-engine-old", "sk-engine-new"
SPEC = spec_of(replicas=3, engine={"maxModelLen": 8192})


def _desired(fleet: DesiredFleet) -> Desired:
    return Desired(
        replicas={r.index: r for r in fleet.replicas},
        nodes=1,
        max_unavailable=1,
        drain_deadline_seconds=60.0,
        warmup_enabled=False,
    )


def _serving(fleet: DesiredFleet, *, key: str | None) -> Observed:
    """Replicas serving `fleet`'s templates, their sets recording `key`'s digest."""
    desired = _desired(fleet)
    digest = key_digest(key) if key is not None else None
    return Observed(
        replicas={
            i: ReplicaFacts(
                index=i,
                leader=dataclasses.replace(set_for(i, desired), engine_key=digest),
                pods=[pod_for(i, engine_key=digest)],
            )
            for i in desired.replicas
        },
        router=None,
    )


def _digests(fleet: DesiredFleet) -> set[str | None]:
    return {
        r.leader["spec"]["template"]["metadata"].get("annotations", {}).get(ANNOTATION_ENGINE_KEY)
        for r in fleet.replicas
    }


def test_a_new_cluster_records_the_digest_of_its_key_and_never_the_key() -> None:
    stamped = with_engine_key(
        fleet_of(SPEC), Observed(replicas={}, router=None), digest=key_digest(OLD), assumed=None
    )
    assert _digests(stamped) == {key_digest(OLD)}
    assert OLD not in json.dumps([r.leader for r in stamped.replicas])


def test_a_rotated_key_replaces_the_replicas_one_at_a_time() -> None:
    before = with_engine_key(
        fleet_of(SPEC), Observed(replicas={}, router=None), digest=key_digest(OLD), assumed=None
    )
    observed = _serving(before, key=OLD)
    after = with_engine_key(
        fleet_of(SPEC), observed, digest=key_digest(NEW), assumed=key_digest(OLD)
    )
    decision = decide(
        desired=_desired(after), observed=observed, probes=Probes(), memory=Memory(), now=0.0
    )
    assert [m["metadata"]["name"] for m in decision.apply] == ["c-r0"]
    assert _digests(after) == {key_digest(NEW)}


def test_a_secret_unreadable_now_rolls_nothing() -> None:
    before = with_engine_key(
        fleet_of(SPEC), Observed(replicas={}, router=None), digest=key_digest(OLD), assumed=None
    )
    observed = _serving(before, key=OLD)
    after = with_engine_key(fleet_of(SPEC), observed, digest=None, assumed=key_digest(OLD))
    assert [manifest_hash(r.leader) for r in after.replicas] == [
        manifest_hash(r.leader) for r in before.replicas
    ]


def test_replicas_made_before_keys_were_followed_keep_their_template_until_a_rotation() -> None:
    plain = fleet_of(SPEC)
    observed = _serving(plain, key=None)
    # The key this operator first read: taken to be theirs, so an upgrade rolls nothing.
    kept = with_engine_key(
        fleet_of(SPEC), observed, digest=key_digest(OLD), assumed=key_digest(OLD)
    )
    assert _digests(kept) == {None}
    # A rotation rolls them out, one at a time.
    after = with_engine_key(
        fleet_of(SPEC), observed, digest=key_digest(NEW), assumed=key_digest(OLD)
    )
    assert _digests(after) == {key_digest(NEW)}
    decision = decide(
        desired=_desired(after), observed=observed, probes=Probes(), memory=Memory(), now=0.0
    )
    assert [m["metadata"]["name"] for m in decision.apply] == ["c-r0"]


def test_the_canary_tries_a_pods_own_key_first_then_the_others() -> None:
    ring = KeyRing()
    ring.remember(OLD)
    ring.remember(NEW)
    assert ring.keys_for(key_digest(OLD)) == (OLD, NEW)
    assert ring.keys_for(key_digest(NEW)) == (NEW, OLD)
    assert ring.keys_for(None) == (OLD, NEW)  # from before keys were followed: the first read
    ring.remember("sk-engine-third")
    assert ring.keys_for(key_digest(OLD)) == ("sk-engine-third", NEW)  # two kept
