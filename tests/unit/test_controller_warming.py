"""The operator's warm-up task (controller/warming.py, `Warmups`): where its
prompts and key are read, and what a failed read costs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shoal.controller import warming
from shoal.controller.identity import ClusterRef
from shoal.controller.kube import ApiError
from shoal.engine.client import EngineClient
from shoal.warmup.prompts import Prompt
from shoal.warmup.runner import WarmupResult
from shoal.warmup.verify import Verdict
from tests.unit.controller_samples import spec_of
from tests.unit.test_controller_decide import pod_for

PROMPTS = "- Summarise the contract in one line.\n- List the parties.\n"


class _FlakyKube:
    """Refuses the first `failures` reads (an API server restarting), then
    answers the warm-up ConfigMap."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.reads = 0

    async def get(self, api: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.reads <= self.failures:
            raise ApiError(503, "the server is currently unable to handle the request")
        return {"data": {"prompts.yaml": PROMPTS}}


def _run(kube: _FlakyKube, monkeypatch: pytest.MonkeyPatch, timeout: int) -> Any:
    sent: list[list[Prompt]] = []

    async def warm(url: str, prompts: list[Prompt], **_: Any) -> WarmupResult:
        sent.append(prompts)
        return WarmupResult(
            verdict=Verdict.WARM, prompts_sent=len(prompts), hit_ratio=1.0,
            duration_seconds=0.1, rounds=1,
        )  # fmt: skip

    monkeypatch.setattr(warming, "warm", warm)
    monkeypatch.setattr(warming, "READ_RETRY_SECONDS", (0.01, 0.05), raising=False)
    spec = spec_of(
        warmup={
            "configMap": {"name": "prompts", "key": "prompts.yaml"},
            "timeoutSeconds": timeout,
        }
    )

    async def main() -> Any:
        async with EngineClient() as engine:
            warmups = warming.Warmups(engine=engine)
            return await warmups._run(kube, ClusterRef("c", "ns", "uid-c"), spec, pod_for(0))  # type: ignore[arg-type]

    return asyncio.run(main()), sent


def test_a_prompts_read_the_api_server_refuses_for_a_moment_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One refused read ended the warm-up: the replica was admitted cold (or,
    with onTimeout Hold, held until someone restarted it)."""
    kube = _FlakyKube(failures=2)
    outcome, sent = _run(kube, monkeypatch, timeout=600)
    assert outcome.verdict is Verdict.WARM, outcome
    assert kube.reads == 3 and len(sent) == 1 and len(sent[0]) == 2


def test_reads_refused_until_the_warm_ups_deadline_end_it_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = _FlakyKube(failures=10**6)
    outcome, sent = _run(kube, monkeypatch, timeout=1)
    assert outcome.verdict is Verdict.UNREACHABLE and not sent
    assert "HTTP 503" in outcome.message and kube.reads > 1
