"""Rollouts that stop before they hurt. Pure: marks read off the replicas'
leader StatefulSets, the spec's text and the wall clock in; which replicas
to replace, roll back or leave alone out.

Each leader StatefulSet records (annotations, written with the apply that
changes it, so a killed operator loses none of it):

- the spec it was built from (`built-from`);
- while its replacement is not yet warm: when it was replaced
  (`replaced-at`) and the spec it ran while it last served (`last-good`);
- once rolled back: the digest of the spec that could not run, less the
  fields that only set the count (`stalled`), and why (`stalled-reason`).

A replaced replica that does not become warm within
rollout.progressDeadlineSeconds, or whose containers cannot run at all
(crash-looping, image not pulled, misconfigured), gets its last good
template back and the rollout is paused: no other replica is replaced
while the spec is the one that stalled. Editing the spec again resumes it;
a new count does not (`COUNT_FIELDS`: else an autoscaler, an HPA or
`kubectl scale` would lift the pause), and a replica made while it holds
gets the template the rollout went back to. Waiting for the deadline (not
rolling back at once) on an unschedulable pod lets a node autoscaler bring
the node it asks for."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from pydantic import ValidationError

from shoal.api.resource import VLLMCluster
from shoal.api.spec import VLLMClusterSpec
from shoal.api.status import ConditionReason
from shoal.controller.desired import DesiredFleet, ReplicaObjects, build_replica
from shoal.controller.identity import ClusterRef, Manifest
from shoal.controller.names import DOMAIN

ANNOTATION_BUILT_FROM = f"{DOMAIN}/built-from"
ANNOTATION_LAST_GOOD = f"{DOMAIN}/last-good"
ANNOTATION_REPLACED_AT = f"{DOMAIN}/replaced-at"
ANNOTATION_STALLED = f"{DOMAIN}/stalled"
ANNOTATION_STALLED_REASON = f"{DOMAIN}/stalled-reason"
MARK_ANNOTATIONS = (
    ANNOTATION_BUILT_FROM,
    ANNOTATION_LAST_GOOD,
    ANNOTATION_REPLACED_AT,
    ANNOTATION_STALLED,
    ANNOTATION_STALLED_REASON,
)
# A spec this long is not kept as an annotation (their total is capped at
# 256 KiB): its replicas are replaced without a template to go back to.
MAX_SPEC_TEXT = 64 * 1024
# Spec fields that only set how many replicas run, written by the scale
# subresource's users (the built-in autoscaler, an HPA, KEDA, `kubectl
# scale`): no replica's objects depend on them, so a spec that differs only
# there is no new spec to a rollout.
COUNT_FIELDS = ("replicas", "autoscaling")


# Why a rollout is paused (the Progressing condition's reason).
RolloutState = Literal[ConditionReason.ROLLOUT_STALLED, ConditionReason.ROLLED_BACK]


def spec_text(spec: VLLMClusterSpec) -> str:
    """The spec in one canonical text: what replicas record they were built from."""
    return _canonical(spec.to_json())


def template_text(text: str) -> str:
    """A spec text (the spec now's, or one a replica recorded, which may
    hold the count of its day) less COUNT_FIELDS: what a replica's objects
    are built from. Texts are compared, and a pause keyed, on this."""
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):  # an annotation edited by hand
        return text
    if not isinstance(found, dict):
        return text
    return _canonical({key: value for key, value in found.items() if key not in COUNT_FIELDS})


def _canonical(spec: object) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Marks:
    """What a leader StatefulSet records about its rollout."""

    built_from: str | None = None  # spec text
    last_good: str | None = None  # spec text
    replaced_at: float | None = None  # wall-clock seconds
    stalled: str | None = None  # digest of the spec that did not run
    stalled_reason: str | None = None

    def annotations(self) -> dict[str, str | None]:
        """As annotations to write: None removes one."""
        at = None if self.replaced_at is None else f"{self.replaced_at:.3f}"
        built = (
            self.built_from if self.built_from and len(self.built_from) <= MAX_SPEC_TEXT else None
        )
        good = self.last_good if self.last_good and len(self.last_good) <= MAX_SPEC_TEXT else None
        return {
            ANNOTATION_BUILT_FROM: built,
            ANNOTATION_LAST_GOOD: good,
            ANNOTATION_REPLACED_AT: at,
            ANNOTATION_STALLED: self.stalled,
            ANNOTATION_STALLED_REASON: self.stalled_reason,
        }


def marks_of(statefulset: Manifest | None) -> Marks:
    if statefulset is None:
        return Marks()
    found = (statefulset.get("metadata") or {}).get("annotations") or {}
    at: float | None
    try:
        at = float(found[ANNOTATION_REPLACED_AT])
    except (KeyError, TypeError, ValueError):
        at = None
    if at is not None and not math.isfinite(at):  # "nan" or "inf" written by hand
        at = None
    return Marks(
        built_from=found.get(ANNOTATION_BUILT_FROM),
        last_good=found.get(ANNOTATION_LAST_GOOD),
        replaced_at=at,
        stalled=found.get(ANNOTATION_STALLED),
        stalled_reason=found.get(ANNOTATION_STALLED_REASON),
    )


@dataclass(frozen=True)
class RolloutPolicy:
    """What the rollout decisions need besides the replicas' facts."""

    spec_text: str  # of the spec now
    deadline_seconds: float
    now_wall: float
    # By replica: every replica that exists has an entry (a new one has none).
    marks: Mapping[int, Marks] = field(default_factory=dict)

    @cached_property
    def template(self) -> str:
        return template_text(self.spec_text)

    @property
    def spec_digest(self) -> str:
        """What a pause on the spec now is keyed on."""
        return digest(self.template)

    @property
    def whole_digest(self) -> str:
        """What operators before COUNT_FIELDS keyed it on: the whole spec text."""
        return digest(self.spec_text)

    def built_from_now(self, text: str | None) -> bool:
        """A recorded spec text builds the replicas the spec now builds."""
        return text is not None and template_text(text) == self.template

    def stalled_now(self, marks: Marks) -> bool:
        """The marks pause the rollout of the spec now (keyed either way)."""
        return marks.stalled is not None and marks.stalled in (
            self.spec_digest,
            self.whole_digest,
        )


@dataclass(frozen=True)
class Stall:
    replica: int
    state: RolloutState
    message: str


def stall(policy: RolloutPolicy) -> Stall | None:
    """The pause in force: a replica rolled back (or stuck) on the spec now."""
    for index, marks in sorted(policy.marks.items()):
        if policy.stalled_now(marks):
            state: RolloutState = ConditionReason.ROLLED_BACK
            if policy.built_from_now(marks.built_from):
                state = ConditionReason.ROLLOUT_STALLED
            return Stall(index, state, marks.stalled_reason or "the rollout is paused")
    return None


def stalled_on_spec(policy: RolloutPolicy, index: int) -> bool:
    """The replica is held at its last good template while the spec is the
    one that did not run on it."""
    marks = policy.marks.get(index, Marks())
    return policy.stalled_now(marks) and not policy.built_from_now(marks.built_from)


def fallback_text(policy: RolloutPolicy, index: int) -> str | None:
    """The spec text to build replica index from instead of the spec now:
    what it went back to, while stalled on the spec now."""
    marks = policy.marks.get(index, Marks())
    return marks.built_from if stalled_on_spec(policy, index) else None


def went_back_to(policy: RolloutPolicy) -> tuple[str, Marks] | None:
    """While the rollout is paused after a rollback: the spec text the
    rollout went back to, and the marks that say so (a replica made now is
    built from it, and held there as the rolled-back one is)."""
    for index, marks in sorted(policy.marks.items()):
        if marks.built_from is not None and stalled_on_spec(policy, index):
            return marks.built_from, marks
    return None


def replaced(policy: RolloutPolicy, index: int, *, serving: bool) -> Marks:
    """Marks for a replica getting the spec now's template: the spec it
    served on is the one to go back to (a replica not serving keeps the one
    it had)."""
    marks = policy.marks.get(index, Marks())
    good = marks.built_from if serving else marks.last_good
    if policy.built_from_now(good):
        good = marks.last_good if not policy.built_from_now(marks.last_good) else None
    return Marks(built_from=policy.spec_text, last_good=good, replaced_at=policy.now_wall)


def created(policy: RolloutPolicy) -> Marks:
    """Marks for a replica made now (`held_back` builds it to match)."""
    paused = went_back_to(policy)
    if paused is None:
        return Marks(built_from=policy.spec_text)
    good, marks = paused
    return Marks(built_from=good, stalled=policy.spec_digest, stalled_reason=marks.stalled_reason)


@dataclass(frozen=True)
class Verdict:
    """What to do with a replica whose new template is not yet serving."""

    roll_back: bool  # give it its last good template back
    stall: bool  # pause the rollout
    marks: Marks | None = None  # the marks to write
    message: str = ""
    wait_seconds: float | None = None  # when to look again, while within the deadline


def judge(
    policy: RolloutPolicy,
    index: int,
    *,
    up_to_date: bool,
    serving: bool,
    cannot_run: str | None,
    has_fallback: bool,
) -> Verdict:
    """A replica replaced (replaced-at set) onto the spec now: done once it
    serves; rolled back when it cannot run or its deadline passed. cannot_run:
    why its containers cannot run, when they cannot; has_fallback: its last
    good template could be built."""
    marks = policy.marks.get(index, Marks())
    keep = Verdict(roll_back=False, stall=False)
    if marks.replaced_at is None or not up_to_date or marks.stalled is not None:
        return keep
    if serving:
        # Warm on the new template: the marks of the replacement go.
        return Verdict(roll_back=False, stall=False, marks=Marks(built_from=marks.built_from))
    elapsed = policy.now_wall - marks.replaced_at
    if cannot_run is None and elapsed < policy.deadline_seconds:
        return Verdict(roll_back=False, stall=False, wait_seconds=policy.deadline_seconds - elapsed)
    why = cannot_run or (
        f"it did not become warm within rollout.progressDeadlineSeconds "
        f"({policy.deadline_seconds:.0f}s)"
    )
    if marks.last_good is None or not has_fallback:
        message = (
            f"replica {index}'s new template cannot run: {why}; no earlier template is known "
            "to go back to; the rollout is paused until the spec changes"
        )
        return Verdict(
            roll_back=False,
            stall=True,
            message=message,
            marks=Marks(
                built_from=marks.built_from,
                stalled=policy.spec_digest,
                stalled_reason=message,
            ),
        )
    message = (
        f"replica {index}'s new template cannot run: {why}; gave it its last good template "
        "back; the rollout is paused until the spec changes"
    )
    return Verdict(
        roll_back=True,
        stall=True,
        message=message,
        marks=Marks(
            built_from=marks.last_good,
            stalled=policy.spec_digest,
            stalled_reason=message,
        ),
    )


def stale(policy: RolloutPolicy, index: int, *, up_to_date: bool, serving: bool) -> Marks | None:
    """Marks to rewrite on a replica settled on its template: a pause for a
    spec no longer asked for, a replacement long done. None: nothing to do."""
    marks = policy.marks.get(index, Marks())
    if marks.stalled == policy.whole_digest:
        # Keyed by an earlier operator on the whole spec: rekeyed at once, so
        # that the pause outlasts a new count from here on.
        return dataclasses.replace(marks, stalled=policy.spec_digest)
    if not up_to_date or not serving:
        return None
    old_stall = marks.stalled is not None and not policy.stalled_now(marks)
    # Stuck on the spec now without a way back, and serving after all (a node came).
    recovered = policy.stalled_now(marks) and policy.built_from_now(marks.built_from)
    if old_stall or recovered or (marks.stalled is None and marks.replaced_at is not None):
        return Marks(built_from=marks.built_from)
    return None


def parsed_spec(text: str) -> VLLMClusterSpec | None:
    """A spec a replica recorded it was built from; None if this version
    cannot read it any more."""
    try:
        return VLLMCluster.model_validate({"spec": json.loads(text)}).spec
    except (ValueError, ValidationError, RecursionError):  # an annotation edited by hand
        return None


def held_back(
    ref: ClusterRef, fleet: DesiredFleet, *, policy: RolloutPolicy
) -> tuple[DesiredFleet, dict[int, ReplicaObjects]]:
    """The fleet with replicas stalled on the spec now kept at the template
    they went back to (and replicas made while so paused built from it: see
    `created`), and each replica's last good template (to go back to)."""
    paused = went_back_to(policy)
    replicas = []
    for objects in fleet.replicas:
        text = fallback_text(policy, objects.index)
        if objects.index not in policy.marks and paused is not None:
            text = paused[0]
        spec = parsed_spec(text) if text is not None else None
        replicas.append(build_replica(ref, spec, index=objects.index) if spec else objects)
    fallback = {}
    for index, marks in policy.marks.items():
        good = parsed_spec(marks.last_good) if marks.last_good else None
        if good is not None:
            fallback[index] = build_replica(ref, good, index=index)
    return dataclasses.replace(fleet, replicas=replicas), fallback
