"""Warm-up gating decisions: a healthy leader is admitted only once its
warm-up verified it warm; a warm-up that did not verify admits or holds it
per onTimeout with a Warning; a new pod uid starts warm-up over; no prompt
source keeps the old admit-on-/health behaviour. Plus where the prompts come
from (inline, ConfigMap YAML, router hot prefixes) and the status a user reads."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from shoal.api.spec import OnTimeout
from shoal.api.status import ConditionStatus
from shoal.controller.decide import (
    Desired,
    Memory,
    Probes,
    WarmupOutcome,
    WarmupPolicy,
    decide,
)
from shoal.controller.observe import Observed, ReplicaFacts, warm_key
from shoal.controller.status import StatusInputs, build_status
from shoal.controller.warming import (
    config_map_prompts,
    hot_prefix_prompts,
    inline_prompts,
    merged_hot_prefixes,
    warmup_policy,
)
from shoal.warmup.prompts import MAX_PROMPT_CHARS, Prompt, combine
from shoal.warmup.verify import Verdict
from tests.unit.controller_samples import spec_of
from tests.unit.test_controller_decide import NOW, desired_for, pod_for, set_for

WARM = WarmupOutcome(
    running=False,
    verdict=Verdict.WARM,
    prompts_sent=12,
    hit_ratio=0.97,
    duration_seconds=1.5,
    message="Warm: 12 prompts sent in 1 round(s), hit ratio 0.97, 1.5s",
)
TIMED_OUT = WarmupOutcome(
    running=False, verdict=Verdict.TIMEOUT, prompts_sent=3, message="Timeout: deadline of 5s passed"
)


def gated(on_timeout: OnTimeout = OnTimeout.ADMIT) -> Desired:
    desired = desired_for(1)
    return replace(
        desired,
        warmup_enabled=True,
        warmup=WarmupPolicy(on_timeout=on_timeout, timeout_seconds=5),
    )


def new_leader(desired: Desired, **changes: object) -> Observed:
    facts: dict[str, Any] = {"ready": False, "warmed": None, **changes}
    pod = pod_for(0, **facts)
    replica = ReplicaFacts(index=0, leader=set_for(0, desired), pods=[pod])
    return Observed(replicas={0: replica}, router=None)


def run(desired: Desired, observed: Observed, **warmups: WarmupOutcome) -> object:
    """warmups by warm_key; a uid alone stands for the pod's first run."""
    runs = {(k if "#" in k else f"{k}#0"): v for k, v in warmups.items()}
    probes = Probes(healthy={"uid-c-r0-0": True}, warmups=runs)
    return decide(desired=desired, observed=observed, probes=probes, memory=Memory(), now=NOW)


def test_a_healthy_leader_is_not_admitted_but_warmed_first() -> None:
    desired = gated()
    decision = run(desired, new_leader(desired))
    assert not decision.gates  # type: ignore[attr-defined]
    assert [p.name for p in decision.warm] == ["c-r0-0"]  # type: ignore[attr-defined]
    assert decision.requeue_seconds is not None  # type: ignore[attr-defined]


def test_a_running_warm_up_is_not_started_again_and_admits_nothing() -> None:
    desired = gated()
    decision = run(desired, new_leader(desired), **{"uid-c-r0-0": WarmupOutcome(running=True)})
    assert not decision.gates and not decision.warm  # type: ignore[attr-defined]


def test_a_verified_warm_up_admits_with_reason_warmed_and_its_numbers() -> None:
    desired = gated()
    decision = run(desired, new_leader(desired), **{"uid-c-r0-0": WARM})
    [gate] = decision.gates  # type: ignore[attr-defined]
    assert (gate.status, gate.reason) == (True, "Warmed")
    assert "12 prompts" in gate.message and "0.97" in gate.message
    assert [e.reason for e in decision.events] == ["ReplicaAdmitted"]  # type: ignore[attr-defined]


def test_a_restarted_pod_new_uid_warms_again_though_the_old_uid_was_warm() -> None:
    desired = gated()
    observed = new_leader(desired, uid="uid-restarted")
    probes = Probes(healthy={"uid-restarted": True}, warmups={"uid-c-r0-0": WARM})
    decision = decide(desired=desired, observed=observed, probes=probes, memory=Memory(), now=NOW)
    assert not decision.gates
    assert [p.uid for p in decision.warm] == ["uid-restarted"]


def test_an_engine_restarted_in_its_pod_warms_again_though_that_pod_was_warm() -> None:
    """kubelet restarts a dead engine in the same pod (same uid): it comes
    back with an empty cache, and its gate went False (EngineRestarted) to
    warm it again. The pod's earlier warm-up is not this run's: admitted on
    it, the cold engine took traffic with a "Warmed" Event."""
    desired = gated()
    observed = new_leader(
        desired,
        restarts=1,
        warmed=ConditionStatus.FALSE,
        warmed_reason="EngineRestarted",
    )
    decision = run(desired, observed, **{"uid-c-r0-0": WARM})
    assert not decision.gates  # type: ignore[attr-defined]
    assert [p.name for p in decision.warm] == ["c-r0-0"]  # type: ignore[attr-defined]
    again = run(desired, observed, **{warm_key(pod_for(0, restarts=1)): WARM})
    assert [(g.status, g.reason) for g in again.gates] == [(True, "Warmed")]  # type: ignore[attr-defined]


def test_a_timed_out_warm_up_admits_with_a_warning_when_on_timeout_is_admit() -> None:
    desired = gated(OnTimeout.ADMIT)
    decision = run(desired, new_leader(desired), **{"uid-c-r0-0": TIMED_OUT})
    [gate] = decision.gates  # type: ignore[attr-defined]
    assert (gate.status, gate.reason) == (True, "WarmupTimedOut")
    [event] = decision.events  # type: ignore[attr-defined]
    assert (event.type, event.reason) == ("Warning", "WarmupTimedOut")


def test_a_timed_out_warm_up_holds_once_with_a_warning_when_on_timeout_is_hold() -> None:
    desired = gated(OnTimeout.HOLD)
    decision = run(desired, new_leader(desired), **{"uid-c-r0-0": TIMED_OUT})
    [gate] = decision.gates  # type: ignore[attr-defined]
    assert (gate.status, gate.reason) == (False, "WarmupHeld")
    [event] = decision.events  # type: ignore[attr-defined]
    assert (event.type, event.reason) == ("Warning", "WarmupHeld")
    # The next pass: the gate is False already; nothing more, no polling.
    again = run(
        desired, new_leader(desired, warmed=ConditionStatus.FALSE), **{"uid-c-r0-0": TIMED_OUT}
    )
    assert not again.gates and not again.events and not again.warm  # type: ignore[attr-defined]
    assert again.requeue_seconds is None  # type: ignore[attr-defined]


def test_nothing_to_verify_admits_rather_than_holding_forever() -> None:
    desired = gated(OnTimeout.HOLD)
    outcome = WarmupOutcome(running=False, verdict=Verdict.NOTHING_TO_VERIFY, message="no prompt")
    decision = run(desired, new_leader(desired), **{"uid-c-r0-0": outcome})
    [gate] = decision.gates  # type: ignore[attr-defined]
    assert (gate.status, gate.reason) == (True, "WarmupUnverifiable")


def test_an_unhealthy_engine_is_neither_warmed_nor_admitted() -> None:
    desired = gated()
    probes = Probes(healthy={"uid-c-r0-0": False})
    decision = decide(
        desired=desired, observed=new_leader(desired), probes=probes, memory=Memory(), now=NOW
    )
    assert not decision.gates and not decision.warm


def test_without_prompt_sources_or_when_disabled_the_leader_is_admitted_on_health() -> None:
    assert warmup_policy(spec_of(replicas=1)) is None
    assert warmup_policy(spec_of(replicas=1, warmup={"prompts": [{"text": "hi"}]})) is not None
    disabled = spec_of(replicas=1, warmup={"enabled": False, "prompts": [{"text": "hi"}]})
    assert warmup_policy(disabled) is None
    desired = replace(desired_for(1), warmup_enabled=True, warmup=None)
    decision = run(desired, new_leader(desired))
    [gate] = decision.gates  # type: ignore[attr-defined]
    assert (gate.status, gate.reason) == (True, "EngineHealthy")
    assert not decision.warm  # type: ignore[attr-defined]


def test_warm_up_prompts_come_from_the_spec_a_config_map_and_hot_prefixes() -> None:
    spec = spec_of(
        replicas=1,
        warmup={
            "prompts": [
                {"text": "system prompt"},
                {"messages": [{"role": "system", "content": "be brief"}]},
            ]
        },
    )
    assert inline_prompts(spec.warmup.prompts) == [
        Prompt(text="system prompt"),
        Prompt(messages=(("system", "be brief"),)),
    ]
    assert config_map_prompts(
        "- text: a\n- messages: [{role: user, content: b}]\n- c\n", max_prompts=9
    ) == [
        Prompt(text="a"),
        Prompt(messages=(("user", "b"),)),
        Prompt(text="c"),
    ]
    with pytest.raises(ValueError):
        config_map_prompts("text: not a list", max_prompts=9)
    chat = {"messages": [{"role": "system", "content": "hot two"}], "count": 5}
    broken = {"messages": [{"role": "user", "content": None}], "count": 3}
    answer = {"prefixes": [{"prompt": "hot one", "count": 9}, chat, broken, {"count": 1}]}
    prompts = hot_prefix_prompts(answer)
    assert prompts == [Prompt(text="hot one"), Prompt(messages=(("system", "hot two"),))]
    # Each in its request's form: chat prefixes go through the chat template.
    assert [p.request("m")[0] for p in prompts] == ["/v1/completions", "/v1/chat/completions"]
    assert prompts[1].request("m")[1] == {
        "model": "m",
        "messages": [{"role": "system", "content": "hot two"}],
        "max_tokens": 1,
    }
    assert hot_prefix_prompts({"error": "disabled"}) == []


def _status(observed: Observed, decision: object, warmups: dict[str, WarmupOutcome]) -> dict:  # type: ignore[type-arg]
    spec = spec_of(replicas=1, warmup={"prompts": [{"text": "hi"}], "onTimeout": "Hold"})
    return build_status(
        StatusInputs(
            name="c",
            namespace="ns",
            generation=1,
            spec=spec,
            errors=[],
            paused=False,
            observed=observed,
            decision=decision,  # type: ignore[arg-type]
            memory=Memory(),
            probes=Probes(healthy={"uid-c-r0-0": True}, warmups=warmups),
            kv_pools={},
            previous={},
            now="2026-01-01T00:00:00Z",
        )
    )


def test_status_shows_warming_then_serving_with_its_hit_ratio_or_held() -> None:
    desired = gated(OnTimeout.HOLD)
    running = {"uid-c-r0-0#0": WarmupOutcome(running=True)}
    cold = new_leader(desired)
    [entry] = _status(cold, run(desired, cold, **running), running)["replicaStatuses"]
    assert entry["state"] == "Warming"
    warm_pod = new_leader(desired, ready=True, warmed=ConditionStatus.TRUE)
    status = _status(
        warm_pod, run(desired, warm_pod, **{"uid-c-r0-0#0": WARM}), {"uid-c-r0-0#0": WARM}
    )
    [entry] = status["replicaStatuses"]
    assert (entry["state"], entry["warmupHitRatio"]) == ("Serving", 0.97)
    assert "12 prompts" in entry["warmup"]
    assert status["warmReplicas"] == 1
    held = new_leader(desired, warmed=ConditionStatus.FALSE)
    failed = {"uid-c-r0-0#0": TIMED_OUT}
    status = _status(held, run(desired, held, **failed), failed)
    [entry] = status["replicaStatuses"]
    assert entry["state"] == "Held"
    assert status["warmReplicas"] == 0


def test_a_prompts_config_map_of_aliases_costs_what_its_prompts_may_weigh() -> None:
    """Anyone who may write ConfigMaps in a cluster's namespace writes the
    warm-up prompts, which the operator (shared by every namespace) reads:
    YAML aliases made a 20 KB key into 1,000 prompts of 10,000 messages each
    (10 million, read and hashed in the operator's loop), or prompts of
    gigabytes when sent. Now: the first maxPrompts entries, each at most as
    large as an inline prompt may be, its messages cut where their text
    passes the size an inline prompt's text may have."""
    chat = "- messages: &l [&m {role: user, content: x}" + ", *m" * 9_999 + "]\n"
    bomb = chat + "- messages: *l\n" * 999
    with pytest.raises(ValueError, match="at most 64 messages"):
        config_map_prompts(bomb, max_prompts=256)
    read = "- a\n" * 300 + "- 5\n"  # the entry past maxPrompts, bad, is never read
    assert len(config_map_prompts(read, max_prompts=300)) == 300
    # The same through a Messages request's system text parts, joined into
    # one string before any message count applies (20 MB from 64 KB here).
    parts = "[&p {type: text, text: " + "z" * 65_536 + "}" + ", *p" * 299 + "]"
    with pytest.raises(ValueError, match="too large"):
        config_map_prompts(f"- system: {parts}\n  messages: []\n", max_prompts=4)
    long = "- messages: [&t {role: user, content: " + "y" * 60_000 + "}" + ", *t" * 63 + "]\n"
    cut = combine([config_map_prompts(long, max_prompts=4)], max_prompts=4)
    assert [p.size for p in cut] == [MAX_PROMPT_CHARS] and len(cut[0].messages or ()) == 2


def test_hot_prefixes_of_several_routers_are_merged_by_their_summed_counts() -> None:
    """Two router pods, each with its share of the traffic: the one listed
    first saw none of it. Before, the warm-up took the first answer (empty)."""
    idle: dict[str, list[object]] = {"prefixes": []}
    busy = {"prefixes": [{"prompt": "tenant a", "count": 3}, {"prompt": "tenant b", "count": 2}]}
    other = {"prefixes": [{"prompt": "tenant b", "count": 4}]}
    assert merged_hot_prefixes([idle, busy, None, other]) == [
        Prompt(text="tenant b"),
        Prompt(text="tenant a"),
    ]
    assert merged_hot_prefixes([idle, {"error": "disabled"}]) == []
    # A count that is not a number of requests weighs nothing: a NaN would
    # leave the order to chance, and one router's infinity would outweigh all.
    garbled = {"prefixes": [{"prompt": "tenant c", "count": c} for c in (math.nan, math.inf)]}
    assert merged_hot_prefixes([garbled, busy]) == [
        Prompt(text="tenant a"),
        Prompt(text="tenant b"),
        Prompt(text="tenant c"),
    ]
