"""The autoscaling benchmark's plot: the offered load, the replicas and the
P99 TTFT over the day, one line per mode (matplotlib's Agg backend, as
`bench.plot`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from shoal.bench.autoscale import Bin, Phase


def plot_day(
    runs: Mapping[str, Sequence[Bin]], phases: Sequence[Phase], path: Path, *, title: str
) -> Path:
    """runs: each mode's timeline (one repeat)."""
    figure, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    load, replicas, ttft = axes
    for mode, bins in runs.items():
        starts = [b.start for b in bins]
        replicas.step(starts, [b.replicas for b in bins], where="post", label=mode)
        ttft.plot(starts, [b.p99_ttft_ms for b in bins], marker=".", label=mode)
    first = next(iter(runs.values()), [])
    load.step([b.start for b in first], [b.offered for b in first], where="post", color="black")
    begin = 0.0
    for phase in phases:
        for axis in axes:
            axis.axvline(begin, color="grey", linewidth=0.5)
        load.text(begin + 1, 0, phase.name, fontsize=8, va="bottom")
        begin += phase.seconds
    load.set_ylabel("requests/s sent")
    replicas.set_ylabel("replicas (pods)")
    ttft.set_ylabel("P99 TTFT (ms)")
    ttft.set_yscale("log")
    ttft.set_xlabel("seconds into the day")
    replicas.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(figure)
    return path
