"""Leader election's rules on a coordination.k8s.io Lease, as client-go
has them: when a candidate may take the Lease, and what it writes. The
Lease itself is read and written by `lease`."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from shoal.controller.identity import Manifest

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"
# client-go's defaults (controller-runtime's too). The holder renews, and a
# candidate tries again, every RETRY_SECONDS.
LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_SECONDS = 2


@dataclasses.dataclass(frozen=True)
class Record:
    """The Lease's spec as election reads it."""

    holder: str  # "" when free or released
    duration: int
    acquired: str | None
    renewed: str | None
    transitions: int


def record_of(lease: Manifest) -> Record:
    spec: dict[str, Any] = lease.get("spec") or {}
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        duration=int(spec.get("leaseDurationSeconds") or LEASE_SECONDS),
        acquired=spec.get("acquireTime"),
        renewed=spec.get("renewTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def held_by_other(record: Record, *, me: str, unchanged_for: float) -> bool:
    """Whether another live operator holds it: named, not us, and seen
    renewed within its duration."""
    return record.holder not in ("", me) and unchanged_for < record.duration


def claimed(record: Record | None, *, me: str, now: str) -> dict[str, Any]:
    """The spec that takes (or renews) the Lease for `me`."""
    renewed = record if record is not None and record.holder == me else None
    transitions = 0 if record is None else record.transitions + (0 if renewed else 1)
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": LEASE_SECONDS,
        "acquireTime": renewed.acquired if renewed else now,
        "renewTime": now,
        "leaseTransitions": transitions,
    }


def micro_time(at: datetime.datetime) -> str:
    """Kubernetes' MicroTime."""
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
