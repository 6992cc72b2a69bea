"""A download's progress as plain data: what `shoal download` serves while it
runs (GET /progress on its pod's IP) and the operator reads into
status.model.download, and the line people read ("12.3 GiB of 140 GiB
(8.8%), ~3 min left"). Pure.

Why HTTP on the pod's IP: the operator already reaches pods at their IPs (its
engine probes), so this needs no RBAC for the Job's pod (it runs without a
token), no API write per update (an annotation patch would be one every few
seconds per download), and no log parsing (logs go through the kubelet,
which kwok nodes and some clusters do not serve). A progress the operator
cannot read leaves the Job's name and attempt in status, as before."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Where `shoal download` serves its progress (the Job's container port "progress").
PROGRESS_PORT = 8001
PROGRESS_PATH = "/progress"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@dataclass(frozen=True)
class Progress:
    """Bytes of the model in the directory (complete files from earlier
    attempts included) of total_bytes; the rate of this attempt's fetches."""

    bytes: int
    total_bytes: int
    bytes_per_second: float = 0.0
    files: int = 0  # files complete
    total_files: int = 0

    @property
    def fraction(self) -> float:
        return min(1.0, self.bytes / self.total_bytes) if self.total_bytes > 0 else 1.0

    @property
    def seconds_left(self) -> float | None:
        """At the current rate; None before a rate is known."""
        if self.bytes_per_second <= 0:
            return None
        return max(0, self.total_bytes - self.bytes) / self.bytes_per_second

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "totalBytes": self.total_bytes,
            "bytesPerSecond": self.bytes_per_second,
            "files": self.files,
            "totalFiles": self.total_files,
        }


def from_json(body: object) -> Progress | None:
    """The progress a downloader served; None for anything else (an older
    image, another program on the port)."""
    if not isinstance(body, Mapping):
        return None
    try:
        found = Progress(
            bytes=int(body["bytes"]),
            total_bytes=int(body["totalBytes"]),
            bytes_per_second=float(body.get("bytesPerSecond") or 0.0),
            files=int(body.get("files") or 0),
            total_files=int(body.get("totalFiles") or 0),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    numbers = (found.bytes, found.total_bytes, found.files, found.total_files)
    if min(numbers) < 0 or not math.isfinite(found.bytes_per_second):
        return None
    return found


def size_text(count: float) -> str:
    """Binary units, three significant digits: 980 B, 12.3 GiB, 140 GiB."""
    value, unit = float(count), _UNITS[0]
    for unit in _UNITS:
        if value < 1000 or unit == _UNITS[-1]:
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {unit}"


def duration_text(seconds: float) -> str:
    """Rounded up as a person would say it: 40 s, 3 min, 2 h 5 min."""
    if seconds < 60:
        return f"{max(1, math.ceil(seconds))} s"
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def describe(progress: Progress) -> str:
    """'12.3 GiB of 140 GiB (8.8%), ~3 min left' (no estimate before a rate, nor at the end)."""
    share = f"{100 * progress.fraction:.1f}%"
    text = f"{size_text(progress.bytes)} of {size_text(progress.total_bytes)} ({share})"
    left = progress.seconds_left
    return text if not left else f"{text}, ~{duration_text(left)} left"
