"""Warm-up gating on the testbed: a replica added to a serving fleet stays
out of rotation (Running, not Ready) until the operator warmed its prefix
cache and verified it, and the router sends it nothing before."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest

from shoal_testbed.cluster import Testbed, bin_dir
from tests.e2e.kube import apply, get_json, wait_for
from tests.e2e.operator_env import (
    MODEL,
    WARMED,
    cluster,
    cluster_manifest,
    condition_of,
    events,
    printed_columns,
    router_url,
    wait_ready,
)
from tests.sim_fixtures import parse_exposition, value

pytestmark = pytest.mark.e2e

PATTERN = "shoal-wu"
# Shared prefixes many blocks long, as system prompts are.
PROMPTS = [
    {"text": f"You are assistant number {i}. " + " ".join(f"rule{j} applies" for j in range(150))}
    for i in range(6)
]


def prompts_sent(gate: dict[str, Any]) -> int:
    """From the gate's message, e.g. "warm-up: Warm: 12 prompts sent in 1 round(s), ..."."""
    match = re.search(r"(\d+) prompts sent", gate.get("message", ""))
    assert match, gate
    return int(match.group(1))


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def shared_prefix_prompt(n: int) -> str:
    """A request of tenant n % 6: its system prompt (a warm-up prompt) and a question."""
    return str(PROMPTS[n % len(PROMPTS)]["text"]) + f" Question {n}: how do I scale?"


class SteadyLoad:
    """Requests through the router one after another: (start time, replica) of
    each, and (start, end, replica) for the ones that succeeded."""

    def __init__(
        self,
        url: str,
        prompt: Callable[[int], str] = lambda n: f"question {n}",
        *,
        pause: float = 0.05,
        chat: Callable[[int], list[dict[str, str]] | None] = lambda n: None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.headers = headers or {}
        self.prompt = prompt
        self.chat = chat  # request n's messages, to send it as chat instead
        self.pause = pause
        self.routed: list[tuple[float, str]] = []
        self.spans: list[tuple[float, float, str]] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30, headers=self.headers) as client:
            n = 0
            while not self._stop.is_set():
                started = time.time()
                messages = self.chat(n)
                path, body = (
                    ("/v1/completions", {"model": MODEL, "prompt": self.prompt(n), "max_tokens": 2})
                    if messages is None
                    else (
                        "/v1/chat/completions",
                        {"model": MODEL, "messages": messages, "max_tokens": 2},
                    )
                )
                try:
                    response = client.post(self.url + path, json=body)
                    if response.status_code == 200:
                        replica = response.headers["x-shoal-replica"]
                        self.routed.append((started, replica))
                        self.spans.append((started, time.time(), replica))
                    else:
                        self.failed.append(f"{response.status_code}: {response.text[:100]}")
                except httpx.HTTPError as error:
                    self.failed.append(repr(error))
                n += 1
                time.sleep(self.pause)

    def to(self, replica: str) -> list[tuple[float, float, str]]:
        return [span for span in self.spans if span[2] == replica]

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=35)


@dataclass(frozen=True)
class EngineSample:
    at: float  # when the answer came: the counters are from no later
    asked: float  # when it was asked for: the counters are from no earlier
    requests: float  # finished requests, every reason
    queries: float  # prefix-cache query tokens
    hits: float  # prefix-cache hit tokens


class EngineSampler:
    """The engine's own counters, read from its /metrics every 50 ms from the
    moment the pod has an IP: what happened on it before and after the router
    first sent it a request, with no help from the engine or the router."""

    def __init__(self, bed: Testbed, ns: str, pod: str) -> None:
        self.bed, self.ns, self.pod = bed, ns, pod
        self.samples: list[EngineSample] = []
        self.ip: str | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        # A watch, not a poll: a new replica can start, warm and take its first
        # routed request within half a second (CI), less than a few kubectl
        # round trips, and the baseline must come from before that request.
        self._watch = subprocess.Popen(
            [
                str(bin_dir() / "kubectl"),
                f"--kubeconfig={bed.kubeconfig}",
                *("get", "pods", "-n", ns, "--watch"),
                *("-o", 'jsonpath={.metadata.name} {.status.podIP}{"\\n"}'),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def _watch_ip(self) -> str | None:
        """The pod's IP once the watch shows one; the watch's first line (the
        namespace's pods as listed) tells __enter__ it is in place."""
        assert self._watch.stdout is not None
        for line in self._watch.stdout:
            self._watching.set()
            name, _, ip = line.strip().partition(" ")
            if name == self.pod and ip:
                return ip
        return None  # the watch ended: stopped

    def _run(self) -> None:
        try:
            self.ip = self._watch_ip()
            self._watch.kill()
            if self.ip is not None:
                self._sample(self.ip)
        except Exception as error:  # kept for the assertions that read the samples
            self.error = error
        finally:
            self._watching.set()

    def _sample(self, ip: str) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                asked = time.time()
                try:
                    text = client.get(f"http://{ip}:8000/metrics").text
                except httpx.HTTPError:
                    self._stop.wait(0.05)
                    continue
                samples = parse_exposition(text)[1]
                requests = sum(
                    v for (name, _), v in samples.items() if name == "vllm:request_success_total"
                )
                self.samples.append(
                    EngineSample(
                        time.time(),
                        asked,
                        requests,
                        value(samples, "vllm:prefix_cache_queries_total"),
                        value(samples, "vllm:prefix_cache_hits_total"),
                    )
                )
                self._stop.wait(0.05)

    def _state(self, moment: float) -> str:
        first = f"{self.samples[0].at - moment:+.3f}s" if self.samples else "none"
        return (
            f"{self.pod} at {self.ip}: {len(self.samples)} samples, the first {first} "
            f"from the moment; error: {self.error!r}"
        )

    def before(self, moment: float) -> EngineSample:
        earlier = [s for s in self.samples if s.at < moment]
        assert earlier, f"no sample before the moment: {self._state(moment)}"
        return earlier[-1]

    def after(self, moment: float) -> EngineSample:
        later = next((s for s in self.samples if s.asked > moment), None)
        assert later is not None, f"no sample after the moment: {self._state(moment)}"
        return later

    def __enter__(self) -> EngineSampler:
        """Once the watch has listed the namespace's pods (it must have some)."""
        self._thread.start()
        assert self._watching.wait(timeout=30), f"no pods listed in {self.ns}"
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._watch.kill()
        self._watch.wait()
        self._thread.join(timeout=5)


def first_requests_hit_rate(
    load: SteadyLoad, sampler: EngineSampler, replica: str, count: int, warmup_requests: int
) -> float:
    """Prefix-cache hit rate of the first `count` routed requests a replica
    served, from its own counters: the last sample before the first of them
    started (after the warm-up: all its requests are counted) and the first
    after the last of them ended."""
    spans = wait_for(
        lambda: load.to(replica)[:count] if len(load.to(replica)) >= count else None,
        what=f"{count} routed requests served by {replica}",
        timeout=30,
    )
    time.sleep(0.2)  # a sample after the last one
    before = sampler.before(spans[0][0])
    after = sampler.after(spans[-1][1])
    assert before.requests >= warmup_requests, (before, warmup_requests)
    assert after.requests - before.requests >= count, (before, after)
    rate = (after.hits - before.hits) / (after.queries - before.queries)
    print(f"\n{replica}: first {count} routed requests hit {rate:.2f} of their prompt tokens")
    return rate


def test_a_new_replica_takes_traffic_only_once_its_warm_up_verified_it_warm(
    testbed: Testbed, ns: str
) -> None:
    manifest = cluster_manifest(
        "warm",
        replicas=2,
        tensor=4,
        # Round-robin gives a new replica its share at once, the case gating is
        # for (cache-aware steers shared prefixes to the replicas its index
        # knows hold them, so a new replica would see few of them).
        router={"policy": "round-robin"},
        warmup={"prompts": PROMPTS, "timeoutSeconds": 60, "minHitRatio": 0.8},
    )
    apply(testbed, ns, manifest)
    wait_ready(testbed, ns, "warm", 2)
    url = router_url(testbed, ns, "warm")
    with (
        SteadyLoad(url, shared_prefix_prompt) as load,
        EngineSampler(testbed, ns, "warm-r2-0") as sampler,
    ):
        wait_for(lambda: len(load.routed) >= 5, what="steady load flowing", timeout=30)
        testbed.kubectl("scale", "vllmcluster/warm", "-n", ns, "--replicas=3")

        def new_pod() -> dict[str, Any] | None:
            found = get_json(testbed, "pods", "-n", ns, "--ignore-not-found", "-o", "json")
            pods = {p["metadata"]["name"]: p for p in found.get("items", [])}
            return pods.get("warm-r2-0")

        # Running (its container up) but not Ready while it warms.
        seen_unready_running = False

        def admitted() -> dict[str, Any] | None:
            nonlocal seen_unready_running
            pod = new_pod()
            if pod is None:
                return None
            ready = condition_of(pod, "Ready").get("status") == "True"
            running = pod.get("status", {}).get("phase") == "Running"
            warmed = condition_of(pod, WARMED).get("status") == "True"
            # The gate holds Ready back until Warmed; Ready follows Warmed at the
            # next status sync, so Warmed may be True a moment before Ready (CI).
            assert warmed or not ready, "Ready before the warm-up gate"
            if running and not ready and not warmed:
                seen_unready_running = True
            return pod if warmed else None

        pod = wait_for(admitted, what="warm-r2-0 admitted", timeout=90, interval=0.2)
        gate = condition_of(pod, WARMED)
        wait_ready(testbed, ns, "warm", 3)
        wait_for(
            lambda: any(r == "warm-r2-0" for _, r in load.routed),
            what="routed requests reaching the new replica",
            timeout=30,
        )
        # Its first routed requests found their tenant's system prompt cached
        # (cold, the first request of each of its tenants would hit nothing:
        # about 0.65 over these six).
        rate = first_requests_hit_rate(load, sampler, "warm-r2-0", 6, prompts_sent(gate))
        assert rate >= 0.9, rate
    assert seen_unready_running, "never saw warm-r2-0 Running but not Ready"
    assert gate["reason"] == "Warmed", gate
    assert "prompts sent" in gate["message"] and "hit ratio" in gate["message"]
    # The router sent the new replica nothing before the gate opened (the
    # condition's time is truncated to the second: compare with that second).
    admitted_at = _time(gate["lastTransitionTime"])
    early = [t for t, replica in load.routed if replica == "warm-r2-0" and t < admitted_at]
    assert early == [], f"{len(early)} requests reached warm-r2-0 before it was admitted"
    assert load.failed == []

    status = cluster(testbed, ns, "warm")["status"]
    entry = next(r for r in status["replicaStatuses"] if r["index"] == 2)
    print(f"\nwarm-r2-0: {entry['warmup']}")
    assert entry["state"] == "Serving"
    assert entry["warmupHitRatio"] >= 0.8
    assert "Warm" in entry["warmup"]
    assert printed_columns(testbed, ns, "warm")["WARM"] == "3"
    reasons = [e["reason"] for e in events(testbed, ns, "warm")]
    assert "ReplicaAdmitted" in reasons


# A shared system prompt of a bit over 2,048 characters: the router's hot
# prefixes are its first 1, 2, 4, ... 32 blocks of 64 characters (the 64-block
# one would reach into the questions, which differ).
HOT_SYSTEM = "You are the support desk of the shoal fleet. " + " ".join(
    f"Policy {j}: be brief." for j in range(96)
)


def test_a_new_replica_warms_from_the_routers_hot_prefixes(testbed: Testbed, ns: str) -> None:
    assert 2048 < len(HOT_SYSTEM) < 2048 + 64
    # Clients need a key, and so does the operator to read the hot prefixes.
    keys = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "router-keys"}}
    apply(testbed, ns, {**keys, "stringData": {"keys": "sk-hot-1\nsk-hot-2\n"}})
    keyed = {"Authorization": "Bearer sk-hot-2"}
    manifest = cluster_manifest(
        "hot",
        replicas=1,
        tensor=4,
        router={
            "policy": "round-robin",
            "hotPrefixes": {"enabled": True},
            "apiKeySecret": {"name": "router-keys", "key": "keys"},
        },
        # No inline prompts and no ConfigMap: the router is the only source.
        warmup={"hotPrefixes": True, "timeoutSeconds": 60, "minHitRatio": 0.8},
    )
    apply(testbed, ns, manifest)
    # The first replica has nothing to warm with (no traffic yet): admitted.
    wait_ready(testbed, ns, "hot", 1)
    url = router_url(testbed, ns, "hot")
    router_ip = url.removeprefix("http://").rsplit(":", 1)[0]

    def question(n: int) -> str:
        return HOT_SYSTEM + f" Question {n}: how do I scale?"

    def chat(n: int) -> list[dict[str, str]] | None:
        # Every third request is chat with the same system prompt (a period
        # of 3, so round-robin gives each replica both forms).
        if n % 3 != 1:
            return None
        user = f"Question {n}: how do I scale?"
        return [{"role": "system", "content": HOT_SYSTEM}, {"role": "user", "content": user}]

    with (
        SteadyLoad(url, question, pause=0.1, chat=chat, headers=keyed) as load,
        EngineSampler(testbed, ns, "hot-r1-0") as sampler,
    ):
        wait_for(lambda: len(load.routed) >= 10, what="traffic through the router", timeout=30)
        # What the operator reads: the router's internal port (9090), from inside.
        inside = f"http://{router_ip}:9090/hot-prefixes"
        assert httpx.get(inside, timeout=5).status_code == 401  # the users' prompts
        hot = httpx.get(inside, headers=keyed, timeout=5).json()["prefixes"]
        texts = [p["prompt"] for p in hot if "prompt" in p]
        assert sorted(len(t) for t in texts) == [64, 128, 256, 512, 1024, 2048], texts
        assert all(HOT_SYSTEM.startswith(t) for t in texts)
        # Chat requests' prefix in their own form, for the engine's chat template.
        chats = [p["messages"] for p in hot if "messages" in p]
        assert chats == [[{"role": "system", "content": HOT_SYSTEM}]], hot

        testbed.kubectl("scale", "vllmcluster/hot", "-n", ns, "--replicas=2")

        def admitted() -> dict[str, Any] | None:
            found = get_json(testbed, "pods", "-n", ns, "--ignore-not-found", "-o", "json")
            pods: dict[str, dict[str, Any]] = {p["metadata"]["name"]: p for p in found["items"]}
            pod = pods.get("hot-r1-0")
            if pod is None or condition_of(pod, WARMED).get("status") != "True":
                return None
            return pod

        gate = condition_of(
            wait_for(admitted, what="hot-r1-0 admitted", timeout=90, interval=0.5), WARMED
        )
        # Warmed, from the seven hot prefixes: each sent once, then each replayed.
        assert gate["reason"] == "Warmed", gate
        assert gate["message"].startswith("warm-up: Warm: 14 prompts sent in 1 round(s)"), gate
        wait_ready(testbed, ns, "hot", 2)
        rate = first_requests_hit_rate(load, sampler, "hot-r1-0", 3, prompts_sent(gate))
        # 2,048 of ~2,080 characters were warm, or the whole system message:
        # nearly every token hits, chat or not (cold, the first of the three
        # would hit nothing: about 0.65).
        assert rate >= 0.9, rate
    assert load.failed == []
    entry = next(
        r for r in cluster(testbed, ns, "hot")["status"]["replicaStatuses"] if r["index"] == 1
    )
    assert entry["state"] == "Serving" and entry["warmupHitRatio"] >= 0.8, entry
