"""The router against engines that fail: each test injects one fault into
simulated engines and checks what clients and the fleet see.

- a half-open probe whose client leaves does not strand its replica;
- a request that fails on every replica is the request's: it goes back to
  its client and opens no breaker;
- one engine failing half its requests costs clients almost nothing, and
  draws less traffic than its healthy peers;
- a stream that stalls mid-way ends with an SSE error within the stall
  deadline, the engine's request is aborted, and the replica counts it;
- broken /metrics leave a replica routable, counted busy, with one warning;
  late ones that then fail, with a second one saying why.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from shoal.procs import start_router, wait_until
from tests.integration.procs import (
    MODEL,
    engine_metric,
    peak_rss_mib,
    router,
    set_fault,
    sims,
    wait_scraped,
)

POISON = "POISONED-PROMPT"


def completion(prompt: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 4, **extra}


def router_counts(front: str, name: str) -> dict[str, float]:
    """A router counter's samples by their label set."""
    samples: dict[str, float] = {}
    for line in httpx.get(front + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            samples[labels] = float(value)
    return samples


def stream_events(front: str, prompt: str) -> list[str]:
    """The SSE data lines of a streamed completion of 50 tokens."""
    with httpx.stream(
        "POST",
        front + "/v1/completions",
        json=completion(prompt, max_tokens=50, stream=True, ignore_eos=True),
        timeout=10,
    ) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line.startswith("data: ")]


def attempts_by_replica(front: str) -> dict[str, float]:
    by_replica: dict[str, float] = {}
    for labels, value in router_counts(front, "shoal_router_requests_total").items():
        replica = re.search(r'replica="([^"]+)"', labels)
        assert replica is not None
        by_replica[replica[1]] = by_replica.get(replica[1], 0.0) + value
    return by_replica


def test_a_probe_whose_client_leaves_does_not_strand_its_replica(tmp_path: Path) -> None:
    config = {"circuitBreaker": {"failureThreshold": 2, "openSeconds": 1}, "retries": 0}
    with sims(1, tmp_path) as urls, router(urls, tmp_path, config=config) as front:
        set_fault(urls[0], error_rate=1.0)
        for i in range(3):
            httpx.post(front + "/v1/completions", json=completion(f"fail {i}"), timeout=10)
        assert (
            httpx.post(front + "/v1/completions", json=completion("open?"), timeout=10).status_code
            == 503
        ), "the breaker did not open: test is void"
        set_fault(urls[0], error_rate=0.0)
        time.sleep(1.5)  # past openSeconds: half-open
        with httpx.stream(
            "POST",
            front + "/v1/completions",
            json=completion("probe", max_tokens=500, stream=True, ignore_eos=True),
            timeout=10,
        ) as probe:
            for _ in probe.iter_raw():
                break  # the probe's client leaves after its first bytes

        def served() -> bool:
            answer = httpx.post(front + "/v1/completions", json=completion("back?"), timeout=10)
            return answer.status_code == 200

        wait_until(served, what="the replica back in rotation", timeout=10, interval=0.5)


def test_a_request_that_fails_on_every_replica_opens_no_breaker(tmp_path: Path) -> None:
    config = {"circuitBreaker": {"failureThreshold": 2, "openSeconds": 30}, "retries": 2}
    with (
        sims(2, tmp_path, extra=["--sim-poison", POISON]) as urls,
        router(urls, tmp_path, config=config) as front,
    ):
        for i in range(6):
            answer = httpx.post(
                front + "/v1/completions", json=completion(f"{POISON} {i}"), timeout=10
            )
            assert answer.status_code == 500, answer.text
            assert answer.json()["error"]["message"] == "Simulated request error (poison)"
        for i in range(4):
            answer = httpx.post(front + "/v1/completions", json=completion(f"fine {i}"), timeout=10)
            assert answer.status_code == 200, answer.text
        states = router_counts(front, "shoal_router_circuit_state")
        assert states and set(states.values()) == {0.0}, states


def test_one_engine_failing_half_its_requests_costs_clients_almost_nothing(
    tmp_path: Path,
) -> None:
    requests = 400
    with (
        sims(2, tmp_path) as healthy,
        sims(1, tmp_path / "..", extra=["--sim-error-rate", "0.5"]) as flaky,
        router([*healthy, *flaky], tmp_path) as front,
    ):
        with httpx.Client(timeout=30) as client, ThreadPoolExecutor(8) as pool:

            def send(i: int) -> int:
                body = completion(f"question {i} " + "context " * (i % 13))
                return client.post(front + "/v1/completions", json=body).status_code

            codes = list(pool.map(send, range(requests)))
        attempts = attempts_by_replica(front)
        retries = sum(router_counts(front, "shoal_router_retries_total").values())
    failed = sum(code != 200 for code in codes)
    assert failed <= requests * 0.005, f"{failed} of {requests} failed"
    flaky_share = attempts.get(flaky[0].removeprefix("http://"), 0.0) / sum(attempts.values())
    assert flaky_share < 1 / 3, f"the failing engine drew {flaky_share:.0%} of the attempts"
    assert retries >= 1, "no retry was counted"


def test_a_stream_that_stalls_ends_with_an_error_event_and_counts_against_its_replica(
    tmp_path: Path,
) -> None:
    config = {"timeouts": {"stallSeconds": 1}, "circuitBreaker": {"failureThreshold": 1}}
    with (
        sims(1, tmp_path, extra=["--sim-stall-after", "2"]) as urls,
        router(urls, tmp_path, config=config) as front,
    ):
        started = time.monotonic()
        events = stream_events(front, "stall")
        waited = time.monotonic() - started
        assert waited < 5, f"the client waited {waited:.1f} s"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert "stopped" in error["message"] and events[-1] == "data: [DONE]", events
        wait_until(
            lambda: engine_metric(urls[0], "vllm:num_requests_running") == 0,
            what="the engine's request aborted",
            timeout=10,
            interval=0.2,
        )
        states = router_counts(front, "shoal_router_circuit_state")
        assert list(states.values()) == [2.0], "the stall did not count against the replica"


def test_an_engine_with_broken_metrics_stays_in_rotation_with_one_warning(tmp_path: Path) -> None:
    config = {"policy": "round-robin"}
    with (
        sims(1, tmp_path, extra=["--sim-broken-metrics", "error"]) as broken,
        sims(1, tmp_path / "..") as healthy,
        router([*broken, *healthy], tmp_path, config=config) as front,
    ):
        name = broken[0].removeprefix("http://")
        _wait_failed_scrapes(front, name, 2)
        for i in range(6):
            answer = httpx.post(front + "/v1/completions", json=completion(f"q{i}"), timeout=10)
            assert answer.status_code == 200
        attempts = attempts_by_replica(front)
        assert attempts.get(name, 0) >= 2, attempts
        set_fault(broken[0], metrics="ok")
        wait_scraped(front, broken)  # a scrape that worked: the episode ended
        set_fault(broken[0], metrics="garbage")
        wait_until(
            lambda: (tmp_path / "router.log").read_text().count("unreadable") >= 2,
            what="the second episode's warning",
            timeout=10,
            interval=0.1,
        )
    log = (tmp_path / "router.log").read_text()
    warnings = [line for line in log.splitlines() if "WARNING" in line and name in line]
    # Two episodes (the 500s, then garbage after a recovery): each says why
    # once. On a busy machine an answer may also be late before it fails:
    # at most one "slow" an episode then.
    unreadable = [line for line in warnings if "unreadable" in line]
    assert len(unreadable) == 2, log
    assert "HTTP 500" in unreadable[0] and "not a whole vLLM scrape" in unreadable[1], log
    assert len(warnings) - len(unreadable) <= 2, log


def test_metrics_late_then_failing_say_why_once(tmp_path: Path) -> None:
    # An exporter that never answers: late at the scrape timeout (1 s), then
    # failed at the answer's limit (2 s). The warning for the late answer
    # once hid every reason after it: an endless answer cut at its size on a
    # busy node (late first) said only "slow". The timeout is 1 s, not the
    # default 0.2 s: the router takes its own loop's stall for the lateness
    # (loop_was_late) and says nothing, and a busy CPU stalls it that long.
    config = {"scrapeTimeoutMilliseconds": 1000}
    with (
        sims(1, tmp_path, extra=["--sim-broken-metrics", "hang"]) as hung,
        sims(1, tmp_path / "..") as healthy,
        router([*hung, *healthy], tmp_path, config=config) as front,
    ):
        name = hung[0].removeprefix("http://")
        wait_until(
            lambda: "unreadable" in (tmp_path / "router.log").read_text(),
            what="the failed scrape's reason in the log",
            timeout=10,
            interval=0.2,
        )
        time.sleep(3.0)  # more rounds of the same episode
        assert httpx.post(front + "/v1/completions", json=completion("q"), timeout=10).is_success
    log = (tmp_path / "router.log").read_text()
    warnings = [line for line in log.splitlines() if "WARNING" in line and name in line]
    assert len(warnings) == 2, log
    assert "slow (no answer within 1 s)" in warnings[0], log
    assert "unreadable (no answer within 2 s)" in warnings[1], log


def _all_answered(front: str) -> list[str]:
    """12 requests of their own prefixes (spread over the replicas), each
    200; the replica that served each."""
    served = []
    for i in range(12):
        prompt = f"a prompt with its own prefix {i} " * 8
        answer = httpx.post(front + "/v1/completions", json=completion(prompt), timeout=10)
        assert answer.status_code == 200, answer.text
        served.append(answer.headers["x-shoal-replica"])
    return served


def _beside_a_lying_engine(tmp_path: Path, mode: str) -> tuple[str, list[str]]:
    """`_all_answered` through a router in front of an engine whose metrics
    lie (`--sim-broken-metrics mode`) and a healthy one, after a few scrape
    rounds, each of the liar's scrapes counted as failed: (the liar's name,
    the replica that served each request)."""
    with (
        sims(1, tmp_path, extra=["--sim-broken-metrics", mode]) as lying,
        sims(1, tmp_path / "..") as healthy,
        router([*lying, *healthy], tmp_path) as front,
    ):
        liar = lying[0].removeprefix("http://")
        _wait_failed_scrapes(front, liar, 2)
        served = _all_answered(front)
    return liar, served


def _wait_failed_scrapes(front: str, name: str, count: int) -> None:
    """Until the router counts `count` failed scrapes of replica `name`."""
    wait_until(
        lambda: (
            router_counts(front, "shoal_router_scrape_failures_total").get(
                f'{{replica="{name}"}}', 0
            )
            >= count
        ),
        what=f"{count} failed scrapes of {name}",
        timeout=20,
        interval=0.1,
    )


def test_an_engine_whose_metrics_are_nan_is_taken_as_busy_and_loses_no_request(
    tmp_path: Path,
) -> None:
    # Well-formed text whose values are NaN (a gauge set from a division by
    # zero): the router must not weigh a NaN load, which no comparison orders.
    _beside_a_lying_engine(tmp_path, "nan")


def test_an_engine_whose_metrics_are_negative_draws_no_traffic_to_itself(
    tmp_path: Path,
) -> None:
    # An exporter whose gauges went below zero (a decrement without its
    # increment): weighed as it is, the lying engine's load is the least
    # there is, and every request goes to it.
    liar, served = _beside_a_lying_engine(tmp_path, "negative")
    assert served.count(liar) < 12, served  # taken as busy: not first choice


def test_an_engine_whose_metrics_never_end_is_not_read_whole_and_loses_no_request(
    tmp_path: Path,
) -> None:
    # A runaway exporter: the scrape, then text without end, as fast as it is
    # read. Each scrape may wait up to 2 s for its answer; read whole meanwhile
    # it would be gigabytes of the router's memory, every round.
    with (
        sims(1, tmp_path, extra=["--sim-broken-metrics", "endless"]) as runaway,
        sims(1, tmp_path / "..") as healthy,
        start_router(
            log=tmp_path / "router.log",
            config={"replicaHeader": True},
            endpoints=[*runaway, *healthy],
        ) as front,
    ):
        front.wait_http("/ready", timeout=20)
        before = peak_rss_mib(front.pid)
        time.sleep(3.0)  # scrape rounds
        _all_answered(front.url)
        grown = peak_rss_mib(front.pid) - before
        assert grown < 64, f"router peak grew {grown:.0f} MiB"
        name = runaway[0].removeprefix("http://")
        unknown = router_counts(front.url, "shoal_router_scrape_failures_total")
        assert unknown.get(f'{{replica="{name}"}}', 0) >= 2, unknown
    log = (tmp_path / "router.log").read_text()
    assert "larger than" in log and "Traceback" not in log, log


def test_a_plain_answer_longer_than_first_byte_seconds_is_waited_for_not_retried(
    tmp_path: Path,
) -> None:
    # vLLM sends a plain (not streamed) answer's head with its body, once it
    # is all generated: the head is no first byte for it to wait for. Before,
    # such a request was cut at firstByteSeconds, run again on the other
    # replica, then answered 503, and both replicas counted failures.
    config = {"timeouts": {"firstByteSeconds": 1, "totalSeconds": 60}, "retries": 1}
    with sims(2, tmp_path, time_scale=1) as urls, router(urls, tmp_path, config=config) as front:
        started = time.monotonic()
        answer = httpx.post(
            front + "/v1/completions",
            json=completion("a long plain answer", max_tokens=300, ignore_eos=True),
            timeout=60,
        )
        took = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert took > 1.5, f"the answer took {took:.1f} s: not past firstByteSeconds, test is void"
        assert answer.json()["usage"]["completion_tokens"] == 300
        retried = router_counts(front, "shoal_router_retries_total")
        assert not retried, retried


def test_streams_that_keep_breaking_after_their_first_bytes_open_the_breaker(
    tmp_path: Path,
) -> None:
    # Each stream's first bytes were a success that reset the count of
    # failures, and its break a failure: the count went 0, 1, 0, 1... and
    # never reached the threshold, so the replica kept every stream it was
    # given, each cut and none retried.
    config = {"timeouts": {"stallSeconds": 1}, "circuitBreaker": {"failureThreshold": 3}}
    with (
        sims(1, tmp_path, extra=["--sim-stall-after", "2"]) as urls,
        router(urls, tmp_path, config=config) as front,
    ):
        for i in range(3):
            events = stream_events(front, f"stall {i}")
            assert '"error"' in events[-2], events[-3:]
        states = router_counts(front, "shoal_router_circuit_state")
        assert list(states.values()) == [2.0], "three broken streams in a row did not open it"


def test_two_replicas_whose_engines_died_lose_no_request_a_third_can_serve(
    tmp_path: Path,
) -> None:
    # Two engine cores dead at once (their servers answer 500 until they
    # exit, 3.7 s later, as vLLM's do): the same 5xx from two replicas is the
    # request's failure only when it does not say the engine died or is
    # shutting down. Before, a request that met both was answered their 500.
    config = {"retries": 2, "policy": "round-robin", "circuitBreaker": {"failureThreshold": 100}}
    with (
        sims(3, tmp_path, extra=["--sim-crash-exit-seconds", "30"]) as urls,
        router(urls, tmp_path, config=config) as front,
    ):
        for url in urls[:2]:
            set_fault(url, crash=True)
        statuses = [
            httpx.post(front + "/v1/completions", json=completion(f"after {i}"), timeout=10)
            for i in range(9)
        ]
        assert [s.status_code for s in statuses] == [200] * 9, [s.text for s in statuses]
        assert {s.headers["x-shoal-replica"] for s in statuses} == {urls[2].removeprefix("http://")}
