"""The pod runner's containers as kubelet reports them: CrashLoopBackOff with
kubelet's backoff, the last exit and its reason, image pulls that fail, and
config errors (pure: a clock is passed in)."""

from __future__ import annotations

import signal

from shoal_testbed import kubelet
from shoal_testbed.kubelet import Container, Terminated
from shoal_testbed.podrunner import status_body
from shoal_testbed.podspec import env_references

WALL = "2026-01-01T00:00:00Z"


def _crash(container: Container, *, at: float, code: int = 1, message: str = "") -> None:
    container.exited(
        code,
        reason=kubelet.termination_reason(code),
        message=message,
        restart=True,
        wall=WALL,
        now=at,
    )


def test_restarts_back_off_ten_seconds_doubling_to_five_minutes() -> None:
    delays = [kubelet.backoff_seconds(n) for n in range(1, 9)]
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]


def test_a_crashing_container_waits_in_crash_loop_back_off_with_its_last_exit() -> None:
    engine = Container(name="engine", image="vllm/vllm-openai:v0.32.0")
    engine.started(wall=WALL, now=0.0)
    _crash(engine, at=2.0, code=2, message="error: unrecognized arguments: --bogus")
    status = engine.status(now=3.0)
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "back-off 10s" in status["state"]["waiting"]["message"]
    last = status["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (2, "Error")
    assert last["message"] == "error: unrecognized arguments: --bogus"
    assert status["restartCount"] == 0 and not status["ready"]
    assert not engine.due(11.9) and engine.due(12.0)

    engine.started(wall=WALL, now=12.0)
    assert engine.status(now=12.5)["restartCount"] == 1
    assert "running" in engine.status(now=12.5)["state"]
    _crash(engine, at=13.0)
    assert "back-off 20s" in engine.status(now=14.0)["state"]["waiting"]["message"]


def test_ten_minutes_of_running_forgets_the_backoff() -> None:
    engine = Container(name="engine", image="vllm/vllm-openai:v0.32.0")
    engine.started(wall=WALL, now=0.0)
    _crash(engine, at=1.0)
    engine.started(wall=WALL, now=11.0)
    _crash(engine, at=12.0)
    engine.started(wall=WALL, now=32.0)
    _crash(engine, at=32.0 + kubelet.BACKOFF_RESET_SECONDS)
    assert "back-off 10s" in engine.status(now=700.0)["state"]["waiting"]["message"]


def test_exit_reasons_are_completed_error_and_oom_killed_for_a_sigkill() -> None:
    assert kubelet.termination_reason(0) is Terminated.COMPLETED
    assert kubelet.termination_reason(1) is Terminated.ERROR
    assert kubelet.termination_reason(-signal.SIGKILL) is Terminated.OOM_KILLED
    assert kubelet.exit_code(-signal.SIGKILL) == 137


def test_an_unpullable_image_shows_err_image_pull_then_image_pull_back_off() -> None:
    image = "vllm/vllm-openai:doesnotexist"
    assert kubelet.unpullable(image) and not kubelet.unpullable("vllm/vllm-openai:v0.32.0")
    engine = Container(name="engine", image=image)
    engine.pull_failed(now=0.0)
    first = engine.status(now=0.5)["state"]["waiting"]
    assert first["reason"] == "ErrImagePull" and image in first["message"]
    later = engine.status(now=5.0)["state"]["waiting"]
    assert later == {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
    assert not engine.due(9.9) and engine.due(10.0)


def test_a_log_tail_message_keeps_kubelets_last_lines_and_bytes() -> None:
    log = "\n".join(f"line {i}" for i in range(200))
    message = kubelet.log_message(log)
    assert message.endswith("line 199") and "line 119\n" not in message
    assert len(kubelet.log_message("x" * 5000).encode()) == kubelet.LOG_MESSAGE_BYTES


def test_a_pod_that_runs_to_completion_reports_its_phase() -> None:
    job = Container(name="job", image="shoal:0.1.0")
    job.started(wall=WALL, now=0.0)
    job.exited(3, reason=Terminated.ERROR, message="", restart=False, wall=WALL, now=1.0)
    pod = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "job", "image": "shoal:0.1.0"}]},
    }
    body = status_body(pod, job, now=2.0)["status"]
    assert body["phase"] == "Failed"
    assert body["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert body["conditions"] == [{"type": "ContainersReady", "status": "False"}]


def test_only_the_played_container_is_reported_and_the_others_keep_their_status() -> None:
    engine = Container(name="engine", image="vllm/vllm-openai:v0.32.0")
    engine.started(wall=WALL, now=0.0)
    _crash(engine, at=1.0)
    sidecar = {"name": "sidecar", "image": "busybox", "ready": True, "restartCount": 0}
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "engine"}, {"name": "sidecar"}]},
        "status": {"containerStatuses": [sidecar]},
    }
    statuses = status_body(pod, engine, now=2.0)["status"]["containerStatuses"]
    assert [s["name"] for s in statuses] == ["engine", "sidecar"]
    assert statuses[1] == sidecar


def test_env_from_secrets_and_config_maps_is_listed_with_optionality() -> None:
    spec = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {
                "name": "B",
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "b", "optional": True}},
            },
        ],
        "envFrom": [{"secretRef": {"name": "all"}}],
    }
    assert env_references(spec) == [
        ("HF_TOKEN", "secret", "hf", "token", False),
        ("B", "configMap", "c", "b", True),
        ("", "secret", "all", None, False),
    ]


def test_the_back_off_message_reads_as_kubelet_writes_it() -> None:
    engine = Container(name="engine", image="vllm/vllm-openai:v0.32.0", pod="crash-r0-0_ns(u-1)")
    at = 0.0
    for _ in range(4):
        engine.started(wall=WALL, now=at)
        _crash(engine, at=at)
        at = engine.retry_at
    assert engine.status(now=at - 1)["state"]["waiting"]["message"] == (
        "back-off 1m20s restarting failed container=engine pod=crash-r0-0_ns(u-1)"
    )
    assert [kubelet.go_duration(s) for s in (10, 300)] == ["10s", "5m0s"]
