"""One measured run: engine counters read, the load driven, counters read
again, and everything summed up into one result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shoal.bench.driver import Outcome, Pacing, drive
from shoal.bench.engines import fleet_report, scrape
from shoal.bench.stats import by_group, errors, routed, summarize
from shoal.bench.workloads import Workload
from shoal.engine.client import EngineClient


async def first_model(url: str) -> str:
    """The first model the server lists (what `vllm bench serve` defaults to)."""
    async with EngineClient() as engine:
        models = await engine.models(url, deadline=10.0)
    if not models:
        raise RuntimeError(f"{url} serves no model")
    return models[0]


def describe_pacing(pacing: Pacing) -> dict[str, object]:
    return {"pacing": type(pacing).__name__, **vars(pacing)}


async def measure(
    url: str | Sequence[str],
    workload: Workload,
    *,
    model: str,
    pacing: Pacing,
    engines: Sequence[str] = (),
    time_scale: float = 1.0,
    request_timeout: float = 300.0,
    run_timeout: float = 3600.0,
    max_concurrency: int | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> tuple[dict[str, Any], list[Outcome]]:
    """The run's result (summary, per-group summaries, errors, placements and
    the engines' counters) and every request's outcome."""
    async with EngineClient() as engine:
        before = await scrape(engine, engines)
        run = await drive(
            url,
            workload.requests,
            model=model,
            pacing=pacing,
            time_scale=time_scale,
            request_timeout=request_timeout,
            run_timeout=run_timeout,
            max_concurrency=max_concurrency,
            on_outcome=on_outcome,
        )
        after = await scrape(engine, engines)
    result: dict[str, Any] = {**describe_pacing(pacing)}
    result.update(summarize(run.outcomes, duration=run.duration))
    groups = by_group(run.outcomes, duration=run.duration, groups=workload.groups)
    if groups:
        result["groups"] = groups
    result["errors"] = errors(run.outcomes)
    result["routed"] = routed(run.outcomes)
    if engines:
        result.update(fleet_report(before, after))
        # The client's mean TTFT less the engines' own: the router, HTTP and
        # the client's event loop (both on engine time).
        result["outside_ttft_ms"] = result["mean_ttft_ms"] - result["engine_ttft_ms"]
    return result, run.outcomes
