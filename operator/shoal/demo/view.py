"""The demo's live per-replica view, built from plain snapshots (no I/O):
what each engine reports (running, waiting, KV usage, prefix hits, finished
requests since the run began), the router's load score for it, and how the
run is going from the client's side."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shoal.bench.driver import Outcome
from shoal.bench.stats import percentile
from shoal.engine.metrics import MetricsSnapshot


@dataclass(frozen=True)
class Snapshot:
    title: str
    elapsed: float
    duration: float
    engines: Mapping[str, MetricsSnapshot | None]  # now
    baseline: Mapping[str, MetricsSnapshot | None]  # when the run began
    load_scores: Mapping[str, float]  # the router's view, by engine URL
    outcomes: Sequence[Outcome]  # answered so far


def _bar(share: float, width: int = 20) -> str:
    filled = 0 if math.isnan(share) else round(share * width)
    return "█" * filled + "·" * (width - filled)


def replica_rows(snapshot: Snapshot) -> list[tuple[str, ...]]:
    """One row per engine: name, running, waiting, KV, hits, requests, share."""
    deltas: dict[str, MetricsSnapshot] = {}
    for url, now in snapshot.engines.items():
        before = snapshot.baseline.get(url)
        if now is not None and before is not None:
            deltas[url] = now.since(before)
    total = sum(d.requests for d in deltas.values())
    rows: list[tuple[str, ...]] = []
    for index, url in enumerate(snapshot.engines):
        d = deltas.get(url)
        name = f"replica {index} (:{url.rsplit(':', 1)[-1]})"
        if d is None:
            rows.append((name, "-", "-", "-", "-", "-", "-", "no metrics"))
            continue
        share = d.requests / total if total else math.nan
        score = snapshot.load_scores.get(url)
        rows.append(
            (
                name,
                "-" if score is None else f"{score:.2f}",
                f"{d.running:.0f}",
                f"{d.waiting:.0f}",
                f"{d.kv_usage:.0%}",
                "-" if math.isnan(d.hit_rate) else f"{d.hit_rate:.0%}",
                f"{d.requests:.0f}",
                f"{_bar(share)} {0 if math.isnan(share) else share:.0%}",
            )
        )
    return rows


def client_line(snapshot: Snapshot) -> str:
    done = [o for o in snapshot.outcomes if o.ok and o.ttft is not None]
    failed = sum(1 for o in snapshot.outcomes if not o.ok)
    ttfts = [1e3 * (o.ttft or 0.0) for o in done]
    p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
    latency = "-" if not ttfts else f"p50 {p50:.0f} ms, p99 {p99:.0f} ms"
    return (
        f"{snapshot.elapsed:4.0f}/{snapshot.duration:.0f} s   answered {len(done)}, "
        f"failed {failed}   TTFT {latency}"
    )


def render(snapshot: Snapshot) -> Group:
    table = Table(title=snapshot.title, header_style="bold", title_justify="left")
    for name in ("replica", "load", "running", "waiting", "KV", "prefix hits", "done"):
        table.add_column(name, justify="left" if name == "replica" else "right")
    table.add_column("routed share")
    for row in replica_rows(snapshot):
        table.add_row(*row)
    return Group(table, Text(client_line(snapshot)))
