"""PNG plots of results (matplotlib's Agg backend: no display needed).

One rate: policies side by side, one panel per measure. Several rates: one
line per policy against the rate, P99 TTFT with each policy's knee limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from shoal.bench.driver import Outcome

# (panel title, result key, scale applied to the value)
_PANELS: tuple[tuple[str, str, float], ...] = (
    ("TTFT p50 (ms)", "median_ttft_ms", 1.0),
    ("TTFT p99 (ms)", "p99_ttft_ms", 1.0),
    ("E2E latency p99 (ms)", "p99_e2el_ms", 1.0),
    ("output tokens/s", "output_throughput", 1.0),
    ("prefix cache hit rate (%)", "prefix_hit_rate", 100.0),
    ("busiest replica / even share", "request_imbalance", 1.0),
)


def _value(result: dict[str, Any], key: str) -> float:
    value = result.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def plot_results(results: Sequence[dict[str, Any]], path: Path, *, title: str) -> Path:
    rates = sorted({r["rate"] for r in results if "rate" in r})
    figure = _sweep(results, rates, title=title) if len(rates) > 1 else _bars(results, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def _bars(results: Sequence[dict[str, Any]], *, title: str) -> Any:
    labels = [str(r.get("policy", i)) for i, r in enumerate(results)]
    panels = list(_PANELS)
    groups = [g for g in (results[0].get("groups") or {})]
    if groups:  # long-tail: the short requests' latency is the point
        panels[2] = (f"{groups[0]} requests' E2E p99 (ms)", f"groups.{groups[0]}", 1.0)
    figure, axes = plt.subplots(2, 3, figsize=(13, 7))
    colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    for axis, (name, key, scale) in zip(axes.flat, panels, strict=True):
        if key.startswith("groups."):
            group = key.split(".", 1)[1]
            values = [
                _value((r.get("groups") or {}).get(group, {}), "p99_e2el_ms") for r in results
            ]
        else:
            values = [_value(r, key) * scale for r in results]
        bars = axis.bar(labels, values, color=colors[: len(labels)])
        axis.bar_label(bars, fmt="%.3g", fontsize=8)
        axis.set_title(name, fontsize=10)
        axis.tick_params(axis="x", labelrotation=20, labelsize=8)
        if key == "prefix_hit_rate":
            ideal = _value(results[0], "ideal_prefix_hit_rate") * 100
            if not math.isnan(ideal):
                axis.axhline(ideal, color="black", linestyle="--", linewidth=1)
                axis.text(0, ideal, " one infinite replica", va="bottom", fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def _sweep(results: Sequence[dict[str, Any]], rates: list[float], *, title: str) -> Any:
    policies: list[str] = []
    for result in results:
        if result["policy"] not in policies:
            policies.append(result["policy"])
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for policy in policies:
        runs = sorted((r for r in results if r["policy"] == policy), key=lambda r: r["rate"])
        x = [r["rate"] for r in runs]
        (line,) = axes[0].plot(x, [_value(r, "p99_ttft_ms") for r in runs], marker="o")
        line.set_label(policy)
        axes[0].axhline(
            2 * _value(runs[0], "p99_ttft_ms"), color=line.get_color(), linestyle=":", linewidth=1
        )
        axes[1].plot(x, [_value(r, "output_throughput") for r in runs], marker="o")
        axes[2].plot(x, [100 * _value(r, "prefix_hit_rate") for r in runs], marker="o")
    axes[0].set_yscale("log")
    axes[0].set_title("TTFT p99 (ms); dotted: 2x idle (knee limit)", fontsize=10)
    axes[1].set_title("output tokens/s", fontsize=10)
    axes[2].set_title("prefix cache hit rate (%)", fontsize=10)
    for axis in axes:
        axis.set_xlabel("offered load (requests/s)")
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_run(
    outcomes: Sequence[Outcome], result: dict[str, Any], path: Path, *, title: str
) -> Path:
    """One run: TTFT of each request over the run, latency distributions, and
    each replica's share of the requests."""
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    groups = sorted({o.group for o in outcomes})
    for group in groups:
        done = [o for o in outcomes if o.ok and o.group == group and o.ttft is not None]
        axes[0].scatter(
            [o.sent for o in done], [1e3 * (o.ttft or 0) for o in done], s=6, label=group
        )
        for key, style in (("ttft", "-"), ("latency", "--")):
            values = sorted(1e3 * v for o in done if (v := getattr(o, key)) is not None)
            if values:
                share = [(i + 1) / len(values) for i in range(len(values))]
                name = "TTFT" if key == "ttft" else "E2E"
                axes[1].plot(values, share, style, label=f"{name} ({group})")
    failed = [o for o in outcomes if not o.ok]
    if failed:
        axes[0].scatter(
            [o.sent for o in failed], [0] * len(failed), marker="x", color="red", label="failed"
        )
    axes[0].set_yscale("log")
    axes[0].set_xlabel("sent at (s)")
    axes[0].set_title("TTFT per request (ms)", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("ms")
    axes[1].set_title("latency distribution (CDF)", fontsize=10)
    axes[1].legend(fontsize=8)
    replicas = [r for r in result.get("replicas") or [] if r.get("scraped")]
    if replicas:
        names = [r["url"].rsplit(":", 1)[-1] for r in replicas]
        shares = [100 * r["request_share"] for r in replicas]
        axes[2].set_title("requests per engine (%, engine counters)", fontsize=10)
    else:
        routed = result.get("routed") or {}
        names = list(routed)
        total = sum(routed.values()) or 1
        shares = [100 * n / total for n in routed.values()]
        axes[2].set_title("requests per replica (%, router header)", fontsize=10)
    bars = axes[2].bar(names, shares)
    axes[2].bar_label(bars, fmt="%.1f", fontsize=8)
    axes[2].tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path
