"""Console tables of results (rich), from the result dictionaries alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

# (column title, result key, format); a key missing from a result shows "-".
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("ok", "completed", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("TTFT mean ms", "mean_ttft_ms", "{:.0f}"),
    ("TTFT p50 ms", "median_ttft_ms", "{:.0f}"),
    ("TTFT p99 ms", "p99_ttft_ms", "{:.0f}"),
    ("ITL p99 ms", "p99_itl_ms", "{:.0f}"),
    ("E2E p99 ms", "p99_e2el_ms", "{:.0f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("out tok/s", "output_throughput", "{:.0f}"),
    ("prefix hits", "prefix_hit_rate", "{:.1%}"),
    ("preempt", "preemptions", "{:.0f}"),
    ("busiest", "request_imbalance", "{:.2f}x"),
)


def cell(result: dict[str, Any], key: str, fmt: str) -> str:
    value = result.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


class _Lead:
    """A table's leading columns: what ran (a policy, or a run's label) and,
    when the results span several rates, the rate."""

    def __init__(self, results: Sequence[dict[str, Any]], table: Table) -> None:
        self.rates = len({r.get("rate") for r in results}) > 1
        # no_wrap: peer policies have long names.
        table.add_column("policy" if "policy" in results[0] else "run", no_wrap=True)
        if self.rates:
            table.add_column("rate", no_wrap=True)

    def cells(self, result: dict[str, Any]) -> list[str]:
        what = str(result.get("policy") or result.get("label") or "-")
        return [what, f"{result['rate']:g}/s"] if self.rates else [what]


def _group_columns(results: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per-group E2E columns when results are split by group (long-tail)."""
    groups: list[str] = []
    for result in results:
        for group in result.get("groups") or {}:
            if group not in groups:
                groups.append(group)
    return [(f"{g} E2E p99 ms", g) for g in groups]


def results_table(
    results: Sequence[dict[str, Any]], *, title: str, caption: str | None = None
) -> Table:
    """One row per run: a policy (and rate, when several were swept)."""
    table = Table(title=title, caption=caption, header_style="bold")
    lead = _Lead(results, table)
    for title_, _, _ in _COLUMNS:
        table.add_column(title_, justify="right")
    group_columns = _group_columns(results)
    for title_, _ in group_columns:
        table.add_column(title_, justify="right")
    spread = any("p99_ttft_ms_min" in r for r in results)
    if spread:
        table.add_column("TTFT p99 seeds min-max", justify="right")
    for result in results:
        row = lead.cells(result) + [cell(result, key, fmt) for _, key, fmt in _COLUMNS]
        for _, group in group_columns:
            row.append(cell((result.get("groups") or {}).get(group, {}), "p99_e2el_ms", "{:.0f}"))
        if spread:
            low = cell(result, "p99_ttft_ms_min", "{:.0f}")
            row.append(f"{low}-{cell(result, 'p99_ttft_ms_max', '{:.0f}')}")
        table.add_row(*row)
    return table


_TTFT_PARTS: tuple[tuple[str, str, str], ...] = (
    ("TTFT mean ms", "mean_ttft_ms", "{:.1f}"),
    ("engines' queue ms", "engine_queue_ms", "{:.1f}"),
    ("engines' prefill ms", "engine_prefill_ms", "{:.1f}"),
    ("outside the engines ms", "outside_ttft_ms", "{:.1f}"),
)


def ttft_table(results: Sequence[dict[str, Any]]) -> Table | None:
    """Where each run's mean time to first token went: waiting in an engine
    to be scheduled, from then to the first token (its prefill and what ran
    beside it), and outside the engines (router, HTTP, client). None when no
    run read the engines' histograms."""
    if not any(cell(r, "engine_ttft_ms", "{}") != "-" for r in results):
        return None
    several = any(len(r.get("seeds") or ()) > 1 for r in results)
    table = Table(
        title="where the mean TTFT went (engines' own histograms)",
        caption="each a median over seeds, so the parts need not add up" if several else None,
        header_style="bold",
    )
    lead = _Lead(results, table)
    for title, _, _ in _TTFT_PARTS:
        table.add_column(title, justify="right")
    for result in results:
        table.add_row(*lead.cells(result), *(cell(result, k, fmt) for _, k, fmt in _TTFT_PARTS))
    return table


def replicas_table(result: dict[str, Any]) -> Table:
    """Each engine's share of one run's work, from its own counters."""
    table = Table(title="replicas (engine counters)", header_style="bold")
    for name in ("engine", "requests", "share", "prefill share", "prefix hits", "preempt"):
        table.add_column(name, justify="right" if name != "engine" else "left")
    for replica in result.get("replicas") or []:
        if not replica.get("scraped"):
            table.add_row(replica["url"], "-", "-", "-", "-", "-")
            continue
        table.add_row(
            replica["url"],
            cell(replica, "requests", "{:.0f}"),
            cell(replica, "request_share", "{:.1%}"),
            cell(replica, "prefill_share", "{:.1%}"),
            cell(replica, "prefix_hit_rate", "{:.1%}"),
            cell(replica, "preemptions", "{:.0f}"),
        )
    return table


def knees_table(knees: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="knee: highest rate before P99 TTFT > 2x its idle value")
    for name in ("policy", "knee", "idle P99 TTFT ms", "limit ms"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    for policy, knee in knees.items():
        rate = knee["knee_rate"]
        shown = "-" if rate is None else f"{rate:g}/s" + ("+" if knee["beyond_sweep"] else "")
        table.add_row(
            policy,
            shown,
            f"{knee['idle_p99_ttft_ms']:.0f}",
            f"{knee['limit_p99_ttft_ms']:.0f}",
        )
    return table


def peers_line(results: Sequence[dict[str, Any]]) -> str:
    """Which router version ran each policy, with the flags it was given
    beyond where it listens and what it routes to."""
    seen: dict[str, str] = {}
    for result in results:
        flags = " ".join(result.get("router_flags") or [])
        seen.setdefault(result["policy"], f"{result['router']} {result['version']}: {flags}")
    return "routers:\n" + "\n".join(f"  {policy}: {text}" for policy, text in seen.items())


def ideal_caption(rows: Sequence[dict[str, Any]]) -> str | None:
    """The hit rate one infinitely large replica would get, as the rows have
    it: over several seeds their median, as the hit rates beside it are;
    none when the rows differ in it (a sweep: each rate has its own)."""
    ideals = {row.get("ideal_prefix_hit_rate") for row in rows}
    if len(ideals) != 1:
        return None
    (ideal,) = ideals
    if ideal is None:
        return None
    seeds = len(rows[0].get("seeds") or ())
    over = f" (median of {seeds} seeds)" if seeds > 1 else ""
    return f"prefix hits of one infinitely large replica: {ideal:.1%}{over}"
