"""Faults look from outside as they do on a real vLLM server."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import httpx
import pytest

from shoal.sim.profiles import PROFILES
from tests.integration.sim_proc import free_ports, sim

COMPLETION = {"model": "tiny", "prompt": "hello there", "max_tokens": 50}


def refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_connections_are_refused_while_the_model_loads(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    with sim(tmp_path, "--sim-startup-seconds", "1.5", port=port, wait=False) as (process, url):
        time.sleep(0.5)  # the process is up, the "model" still loading
        assert process.proc.poll() is None
        assert refused(port)
        process.wait_healthy(url)
        assert not refused(port)


def test_a_hung_engine_answers_health_but_not_completions(tmp_path: Path) -> None:
    with sim(tmp_path, "--sim-fault-api") as (_, url):
        assert httpx.post(f"{url}/_sim/fault", json={"hang": True}).json()["hang"] is True
        assert httpx.get(f"{url}/health").status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=1.0)
        assert httpx.get(f"{url}/metrics").status_code == 200
        running = [
            line
            for line in httpx.get(f"{url}/metrics").text.splitlines()
            if line.startswith("vllm:num_requests_running")
        ]
        assert running == ['vllm:num_requests_running{engine="0",model_name="tiny"} 0.0']
        httpx.post(f"{url}/_sim/fault", json={"hang": False})
        response = httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=10)
        assert response.json()["usage"]["completion_tokens"] == 50


def test_hang_by_flag(tmp_path: Path) -> None:
    with sim(tmp_path, "--sim-hang-after", "0") as (_, url):
        assert httpx.get(f"{url}/health").status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=1.0)


def test_a_crash_turns_health_503_then_the_process_exits(tmp_path: Path) -> None:
    # Seconds enough for two requests on a busy CPU before the process goes.
    port = free_ports(1)[0]
    args = ("--sim-fault-api", "--sim-crash-exit-seconds", "5")
    with sim(tmp_path, *args, port=port) as (process, url), httpx.Client(timeout=5) as client:
        client.post(f"{url}/_sim/fault", json={"crash": True})
        assert client.get(f"{url}/health").status_code == 503
        response = client.post(f"{url}/v1/completions", json=COMPLETION)
        assert response.status_code == 500
        assert process.proc.wait(15) == 1
        assert refused(port)


def test_a_dead_engine_answers_as_vllms_internal_server_error(tmp_path: Path) -> None:
    """vLLM maps EngineDeadError to "InternalServerError"; a stream it
    breaks ends with the error written by json.dumps (spaced), then [DONE]."""
    message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
    args = ("--sim-fault-api", "--sim-crash-exit-seconds", "5")
    with sim(tmp_path, *args) as (_, url), httpx.Client(timeout=10) as client:
        body = {**COMPLETION, "max_tokens": 1000, "stream": True}
        with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            client.post(f"{url}/_sim/fault", json={"crash": True})
            events = [line for line in lines if line]
        assert events[-2:] == [
            f'data: {{"error": {{"message": "{message}", "type": "InternalServerError", '
            '"param": null, "code": 500}}',
            "data: [DONE]",
        ]
        after = client.post(f"{url}/v1/completions", json=COMPLETION)
        compact = f'{{"error":{{"message":"{message}","type":"InternalServerError",'
        assert (after.status_code, after.text) == (500, compact + '"param":null,"code":500}}')


def test_a_connection_reset_fault_resets_every_request_but_the_fault_api(
    tmp_path: Path,
) -> None:
    with sim(tmp_path, "--sim-fault-api") as (_, url), httpx.Client(timeout=5) as client:
        assert client.get(f"{url}/health").status_code == 200  # a kept-alive connection
        assert (
            client.post(f"{url}/_sim/fault", json={"connections": "reset"}).json()["connections"]
            == "reset"
        )
        # Pooled and fresh connections alike: a reset, never an HTTP answer.
        for path in ("/health", "/metrics", "/v1/models"):
            with pytest.raises(httpx.ReadError, match="reset by peer"):
                client.get(f"{url}{path}")
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=5)
        # The connection is accepted (not refused): the failure is the reset.
        port = int(url.rsplit(":", 1)[1])
        assert not refused(port)
        assert client.get(f"{url}/_sim/fault").json()["connections"] == "reset"
        bad = client.post(f"{url}/_sim/fault", json={"connections": "drop"})
        assert bad.status_code == 400 and "connections must be one of" in bad.text
        client.post(f"{url}/_sim/fault", json={"connections": "ok"}).raise_for_status()
        assert client.get(f"{url}/health").status_code == 200
        response = client.post(f"{url}/v1/completions", json=COMPLETION)
        assert response.json()["usage"]["completion_tokens"] == 50


def test_connection_reset_by_flag(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    with sim(tmp_path, "--sim-connections", "reset", port=port, wait=False) as (process, url):
        deadline = time.monotonic() + 20
        while refused(port):  # loading
            assert time.monotonic() < deadline and process.proc.poll() is None
            time.sleep(0.05)
        with pytest.raises(httpx.ReadError):
            httpx.get(f"{url}/health", timeout=5)


def test_crash_by_flag_exits(tmp_path: Path) -> None:
    # Not waited healthy: on a busy CPU it may crash before /health is asked.
    port = free_ports(1)[0]
    args = ("--sim-crash-after", "0.5", "--sim-crash-exit-seconds", "0.2")
    with sim(tmp_path, *args, port=port, wait=False) as (process, _):
        assert process.proc.wait(20) == 1


def test_error_rate_answers_500_with_an_error_body(tmp_path: Path) -> None:
    with sim(tmp_path, "--sim-error-rate", "1") as (_, url):
        response = httpx.post(f"{url}/v1/completions", json=COMPLETION)
        assert response.status_code == 500
        assert response.json()["error"]["code"] == 500
        assert httpx.get(f"{url}/health").status_code == 200


def test_slowness_stretches_steps(tmp_path: Path) -> None:
    # A bound a busy CPU cannot break (steps sleep at least their time), where
    # a ratio of two wall times could: 50 decode steps of tiny-cpu, 20 times.
    least = 0.9 * 20 * 50 * PROFILES["tiny-cpu"].step_seconds(prompt_tokens=0, decode_seqs=1)
    with sim(tmp_path, "--sim-fault-api") as (_, url), httpx.Client(timeout=30) as client:

        def timed() -> float:
            started = time.perf_counter()
            client.post(f"{url}/v1/completions", json=COMPLETION).raise_for_status()
            return time.perf_counter() - started

        fast = timed()
        client.post(f"{url}/_sim/fault", json={"slowness": 20})
        slow = timed()
    assert slow >= least and slow > fast, (slow, fast, least)


@pytest.mark.parametrize(("mode", "status"), [("error", 500), ("garbage", 200)])
def test_broken_metrics(tmp_path: Path, mode: str, status: int) -> None:
    with sim(tmp_path, "--sim-broken-metrics", mode) as (_, url):
        response = httpx.get(f"{url}/metrics")
        assert response.status_code == status
        assert "vllm:" not in response.text


def test_fault_api_is_off_unless_enabled(tmp_path: Path) -> None:
    with sim(tmp_path) as (_, url):
        assert httpx.post(f"{url}/_sim/fault", json={"hang": True}).status_code == 404


def test_sigterm_stops_promptly_even_with_requests_hung(tmp_path: Path) -> None:
    import threading

    with sim(tmp_path, "--sim-hang-after", "0") as (process, url):

        def hung_request() -> None:
            with contextlib.suppress(httpx.TransportError):
                httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=30)

        client = threading.Thread(target=hung_request, daemon=True)
        client.start()
        time.sleep(0.3)
        started = time.monotonic()
        process.proc.terminate()
        assert process.proc.wait(10) == 0
        assert time.monotonic() - started < 5


def test_refusing_connections_for_a_while_spares_open_streams_and_lifts_itself(
    tmp_path: Path,
) -> None:
    port = free_ports(1)[0]
    with sim(tmp_path, "--sim-fault-api", port=port) as (process, url):
        body = {**COMPLETION, "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            answer = httpx.post(f"{url}/_sim/fault", json={"refuse_seconds": 1.5})
            assert answer.status_code == 200, answer.text
            time.sleep(0.2)
            assert refused(port)
            assert process.proc.poll() is None
            rest = list(lines)  # the open stream carries on to its end
        assert "data: [DONE]" in rest
        deadline = time.monotonic() + 10
        while refused(port):
            assert time.monotonic() < deadline, "still refusing past refuse_seconds"
            time.sleep(0.05)
        assert httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=10).status_code == 200
        bad = httpx.post(f"{url}/_sim/fault", json={"refuse_seconds": -1})
        assert bad.status_code == 400 and "refuse_seconds" in bad.text
