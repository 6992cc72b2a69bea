"""Warm-up of leader engines, in the background: one task per leader pod uid
(a restarted pod is a new uid and warms again), at most WARMUP_CONCURRENCY at
once for the operator, never awaited by a reconciliation pass. A pass reads
the tasks' state (`outcomes`) and starts the ones its decision asks for."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from shoal.api.router import INTERNAL_PORT
from shoal.api.spec import VLLMClusterSpec, WarmupPrompt
from shoal.controller.decide import WarmupOutcome, WarmupPolicy
from shoal.controller.engine import served_model_name
from shoal.controller.identity import ClusterRef
from shoal.controller.kube import KubeApi
from shoal.controller.names import ENGINE_PORT, router_selector, selector_text
from shoal.controller.observe import PodFacts, warm_key
from shoal.controller.probes import engine_key, router_key
from shoal.engine.client import EngineClient
from shoal.engine.endpoints import base_url
from shoal.engine.errors import EngineError
from shoal.warmup.prompts import Prompt, combine, from_object
from shoal.warmup.runner import warm
from shoal.warmup.verify import Verdict

log = logging.getLogger(__name__)

# Warm-ups running at once, over every cluster of the operator.
WARMUP_CONCURRENCY = 8
HOT_PREFIXES_TIMEOUT_SECONDS = 3.0
# A failed read of the prompts or key: the first and the longest wait before the next.
READ_RETRY_SECONDS = (2.0, 30.0)


def warmup_policy(spec: VLLMClusterSpec) -> WarmupPolicy | None:
    """None when there is nothing to run: disabled, or no prompt source set."""
    warmup = spec.warmup
    if not warmup.enabled:
        return None
    if not (warmup.prompts or warmup.config_map is not None or warmup.hot_prefixes):
        return None
    return WarmupPolicy(on_timeout=warmup.on_timeout, timeout_seconds=warmup.timeout_seconds)


def inline_prompts(prompts: Iterable[WarmupPrompt]) -> list[Prompt]:
    out = []
    for prompt in prompts:
        if prompt.messages:
            out.append(Prompt(messages=tuple((m.role, m.content) for m in prompt.messages)))
        elif prompt.text:
            out.append(Prompt(text=prompt.text))
    return out


def config_map_prompts(content: str, *, max_prompts: int) -> list[Prompt]:
    """A YAML list of prompts ({text: ...}, {messages: [...]} or plain
    strings): its first max_prompts entries (no more are sent). Whoever may
    write ConfigMaps in the namespace writes it, and YAML aliases can make a
    small key name millions of messages: an entry is refused past the
    messages an inline prompt may have (`from_object`), and cut to its size
    when sent (`combine`)."""
    items = yaml.safe_load(content) or []
    if not isinstance(items, list):
        raise ValueError("the ConfigMap key must hold a YAML list of prompts")
    return [from_object(item) for item in items[:max_prompts]]


def hot_prefix_prompts(answer: Any) -> list[Prompt]:
    """The router's /hot-prefixes, each in its request's form: `prompt` (sent
    to /v1/completions) or `messages` (sent to /v1/chat/completions, so the
    engine's chat template renders them as it renders the chat traffic).
    An entry of neither form is skipped."""
    return merged_hot_prefixes([answer])


def merged_hot_prefixes(answers: Iterable[Any]) -> list[Prompt]:
    """Several routers' /hot-prefixes as one list, by their counts summed.
    A Service splits the traffic, so each router sees only its share: the
    first one to answer may have seen none of it."""
    counts: dict[Prompt, float] = {}
    for answer in answers:
        prefixes = answer.get("prefixes") if isinstance(answer, dict) else None
        for prefix in prefixes or []:
            try:
                prompt = from_object(prefix)
            except ValueError:
                continue
            count = prefix.get("count") if isinstance(prefix, dict) else None
            # Not a number of requests (a NaN would leave the order to
            # chance, an infinity outweigh every other router): no weight.
            weight = float(count) if isinstance(count, int | float) else 0.0
            weight = weight if math.isfinite(weight) else 0.0
            counts[prompt] = counts.get(prompt, 0) + weight
    # Stable: equal counts keep the order the routers listed them in.
    return sorted(counts, key=lambda prompt: -counts[prompt])


class Warmups:
    """The operator's warm-up tasks, by cluster and leader engine run (`warm_key`)."""

    def __init__(self, *, engine: EngineClient, concurrency: int = WARMUP_CONCURRENCY) -> None:
        self._engine = engine  # the operator's; its owner closes it
        self._limit = asyncio.Semaphore(concurrency)
        self._tasks: dict[ClusterRef, dict[str, asyncio.Task[WarmupOutcome]]] = {}

    def outcomes(self, ref: ClusterRef, live: set[str]) -> dict[str, WarmupOutcome]:
        """State of the cluster's warm-ups of live runs (`warm_key`); those of
        gone pods, or of engines since restarted, are dropped."""
        tasks = self._tasks.setdefault(ref, {})
        for uid in [u for u in tasks if u not in live]:
            tasks.pop(uid).cancel()
        found = {}
        for uid, task in tasks.items():
            if not task.done():
                found[uid] = WarmupOutcome(running=True)
            elif task.cancelled():
                found[uid] = WarmupOutcome(running=False, verdict=Verdict.UNREACHABLE)
            else:
                found[uid] = task.result()
        return found

    def start(
        self,
        kube: KubeApi,
        ref: ClusterRef,
        spec: VLLMClusterSpec,
        pod: PodFacts,
        done: Callable[[], None],
    ) -> None:
        tasks = self._tasks.setdefault(ref, {})
        key = warm_key(pod)
        if key in tasks:
            return
        task = asyncio.create_task(self._run(kube, ref, spec, pod))
        task.add_done_callback(lambda _: done())
        tasks[key] = task

    def forget(self, ref: ClusterRef) -> None:
        for task in self._tasks.pop(ref, {}).values():
            task.cancel()

    def cancel_all(self) -> None:
        for tasks in self._tasks.values():
            for task in tasks.values():
                task.cancel()
        self._tasks.clear()

    async def _run(
        self, kube: KubeApi, ref: ClusterRef, spec: VLLMClusterSpec, pod: PodFacts
    ) -> WarmupOutcome:
        warmup = spec.warmup
        loop = asyncio.get_running_loop()
        deadline = loop.time() + warmup.timeout_seconds
        async with self._limit:
            first, longest = READ_RETRY_SECONDS
            delay = first
            while True:
                try:
                    prompts = await _prompts(kube, ref, spec, engine=self._engine)
                    key = await engine_key(kube, namespace=ref.namespace, spec=spec)
                    break
                except Exception as error:
                    # An API server restarting, a ConfigMap being fixed: tried
                    # again until the warm-up's deadline, where one failure
                    # admitted the replica cold (or held it for good).
                    message = f"could not read warm-up prompts or the engines' API key: {error}"
                    if loop.time() + delay >= deadline:
                        return WarmupOutcome(
                            running=False, verdict=Verdict.UNREACHABLE, message=message
                        )
                    log.warning(
                        "warm-up of %s/%s: %s; again in %.0fs",
                        ref.namespace, pod.name, message, delay,
                    )  # fmt: skip
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, longest)
            if not prompts:
                return WarmupOutcome(
                    running=False,
                    verdict=Verdict.NOTHING_TO_VERIFY,
                    message="no warm-up prompt was found in any source",
                )
            result = await warm(
                base_url(pod.ip or "", port=ENGINE_PORT),
                prompts,
                engine=self._engine.with_key(key),
                model=served_model_name(spec),
                min_hit_ratio=warmup.min_hit_ratio,
                timeout_seconds=max(deadline - loop.time(), 1.0),
                concurrency=warmup.concurrency,
            )
        log.info("warm-up of %s/%s: %s", ref.namespace, pod.name, result.message)
        return WarmupOutcome(
            running=False,
            verdict=result.verdict,
            prompts_sent=result.prompts_sent,
            hit_ratio=result.hit_ratio,
            duration_seconds=result.duration_seconds,
            message=result.message,
        )


async def _prompts(
    kube: KubeApi, ref: ClusterRef, spec: VLLMClusterSpec, *, engine: EngineClient
) -> list[Prompt]:
    warmup = spec.warmup
    sources: list[list[Prompt]] = [inline_prompts(warmup.prompts)]
    if warmup.config_map is not None:
        found = await kube.get("v1", "ConfigMap", ref.namespace, warmup.config_map.name)
        content = ((found or {}).get("data") or {}).get(warmup.config_map.key)
        if content:
            sources.append(config_map_prompts(content, max_prompts=warmup.max_prompts))
    if warmup.hot_prefixes and spec.router.hot_prefixes.enabled:
        key = await router_key(kube, namespace=ref.namespace, spec=spec)
        sources.append(await _hot_prefixes(kube, ref, engine=engine.with_key(key)))
    return combine(sources, max_prompts=warmup.max_prompts)


async def _hot_prefixes(kube: KubeApi, ref: ClusterRef, *, engine: EngineClient) -> list[Prompt]:
    """Every router pod's hot prefixes, merged (`merged_hot_prefixes`); none
    when no router answers."""
    pods = await kube.list("v1", "Pod", ref.namespace, selector_text(router_selector(ref.name)))
    ips = [ip for pod in pods if (ip := (pod.get("status") or {}).get("podIP"))]
    found = await asyncio.gather(*(_read_hot(ip, engine=engine) for ip in ips))
    return merged_hot_prefixes(found)


async def _read_hot(ip: str, *, engine: EngineClient) -> Any:
    url = base_url(ip, port=INTERNAL_PORT) + "/hot-prefixes"
    try:
        answer = await engine.get(url, deadline=HOT_PREFIXES_TIMEOUT_SECONDS)
        return answer.json() if answer.status == 200 else None
    except (EngineError, ValueError):
        return None
