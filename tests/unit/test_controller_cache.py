"""spec.model.cache as manifests: the shared claim (ReadWriteMany) and the
download Job filling it with the token and the engines' env; engines that
mount it read-only and load the downloaded directory offline; a node cache
on a host directory; what a Job's state means; and the rules at admission."""

from __future__ import annotations

from typing import Any

from shoal.api.cache import DownloadState
from shoal.api.validation import validate_spec
from shoal.controller.cache import (
    build_cache_claim,
    build_download_job,
    download_state,
    download_status,
    progress_url,
)
from shoal.controller.engine import build_leader_statefulset
from shoal.download.progress import Progress
from tests.unit.controller_samples import REF, ROUTER_IMAGE, spec_of

HF = {"id": "org/tiny", "revision": "v1", "tokenSecret": {"name": "hf", "key": "token"}}


def cached(cache: dict[str, Any], **fields: Any) -> Any:
    return spec_of(
        model={"name": "org/tiny", "source": {"hf": HF}, "cache": cache},
        engine={"env": [{"name": "HF_ENDPOINT", "value": "http://mirror"}]},
        **fields,
    )


def engine_container(spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = build_leader_statefulset(REF, spec, index=0)["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_engines_of_a_shared_cache_load_the_downloaded_directory_read_only_and_offline() -> None:
    pod, container = engine_container(cached({"shared": {}}))
    assert container["args"][0] == "/models/org--tiny@v1"
    assert "--revision" not in container["args"]  # the directory is that revision
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "c-models", "readOnly": True}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    env = env_of(container)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_the_shared_claim_is_read_write_many_of_the_size_and_class_asked() -> None:
    spec = cached({"shared": {"size": "50Gi", "storageClassName": "nfs"}})
    claim = build_cache_claim(REF, spec)
    assert claim is not None and claim["metadata"]["name"] == "c-models"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "nfs",
    }


def test_a_claim_the_user_names_is_used_and_not_made() -> None:
    spec = cached({"shared": {"claimName": "team-models"}})
    assert build_cache_claim(REF, spec) is None
    pod, _ = engine_container(spec)
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["team-models"]
    job = build_download_job(REF, spec, image=ROUTER_IMAGE)
    assert job is not None
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "team-models"
    }


def test_the_download_job_runs_shoal_download_with_the_token_and_the_engines_env() -> None:
    spec = cached({"shared": {"backoffLimit": 2}})
    job = build_download_job(REF, spec, image=ROUTER_IMAGE, pull_secrets=["regcred"])
    assert job is not None
    assert job["metadata"]["name"].startswith("c-dl-")
    assert job["spec"]["backoffLimit"] == 2
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    container = pod["containers"][0]
    assert container["image"] == ROUTER_IMAGE
    assert [*container["command"], *container["args"]] == [
        "shoal", "download", "--repo", "org/tiny", "--dir", "/models/org--tiny@v1",
        "--revision", "v1", "--host", "0.0.0.0", "--progress-port", "8001",
    ]  # fmt: skip
    assert container["ports"] == [{"name": "progress", "containerPort": 8001, "protocol": "TCP"}]
    env = env_of(container)
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_ENDPOINT"] == "http://mirror"
    assert container["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    assert container["resources"]["requests"]  # never BestEffort


def test_another_revision_is_another_directory_and_another_job() -> None:
    one = build_download_job(REF, cached({"shared": {}}), image=ROUTER_IMAGE)
    other_spec = spec_of(
        model={
            "name": "org/tiny",
            "source": {"hf": {**HF, "revision": "v2"}},
            "cache": {"shared": {}},
        }
    )
    other = build_download_job(REF, other_spec, image=ROUTER_IMAGE)
    assert one is not None and other is not None
    assert one["metadata"]["name"] != other["metadata"]["name"]


def test_without_a_shared_cache_there_is_no_job_and_no_claim() -> None:
    for spec in (spec_of(), cached({"node": {}})):
        assert build_download_job(REF, spec, image=ROUTER_IMAGE) is None
        assert build_cache_claim(REF, spec) is None


def test_a_node_cache_is_the_engines_hub_cache_on_a_host_directory() -> None:
    pod, container = engine_container(cached({"node": {"path": "/mnt/nvme/models"}}))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["hf-cache"]["hostPath"] == {
        "path": "/mnt/nvme/models",
        "type": "DirectoryOrCreate",
    }
    assert "emptyDir" not in volumes["hf-cache"]
    assert container["args"][0] == "org/tiny" and "--revision" in container["args"]
    assert env_of(container)["HF_HOME"] == "/cache/huggingface"


def test_without_a_cache_each_pod_downloads_into_its_own_empty_dir() -> None:
    pod, _ = engine_container(spec_of())
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["hf-cache"] == {"name": "hf-cache", "emptyDir": {}}


def job(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c-dl-x"}, "spec": {"backoffLimit": 3}, "status": status}


def failed_pod(message: str, finished: str) -> dict[str, Any]:
    terminated = {"exitCode": 1, "reason": "Error", "message": message, "finishedAt": finished}
    return {"status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}


def test_a_failed_job_is_reported_with_the_last_line_of_its_last_pod() -> None:
    pods = [
        failed_pod("old\nshoal download: earlier", "2026-01-01T00:00:00Z"),
        failed_pod(
            "log...\nshoal download: 401 from Hugging Face: set ...tokenSecret",
            "2026-01-01T00:01:00Z",
        ),
    ]
    conditions = [{"type": "Failed", "status": "True", "message": "backoff limit"}]
    found = download_state(job({"failed": 4, "conditions": conditions}), pods, name="c-dl-x")
    assert found.state is DownloadState.FAILED
    assert "shoal download: 401 from Hugging Face: set ...tokenSecret;" in found.message
    assert "kubectl delete job c-dl-x" in found.message  # how to run it again


def test_a_running_job_counts_its_attempts_and_a_completed_one_is_complete() -> None:
    running = download_state(job({"active": 1, "failed": 1}), [], name="c-dl-x")
    assert running.state is DownloadState.RUNNING and "attempt 2 of 4" in running.message
    done = download_state(
        job({"conditions": [{"type": "Complete", "status": "True"}]}), [], name="c-dl-x"
    )
    assert done.complete
    assert download_state(None, [], name="c-dl-x").state is DownloadState.PENDING


def test_a_cache_needs_exactly_one_kind_and_a_hub_model() -> None:
    both = cached({"shared": {}, "node": {}})
    assert [e.rule for e in validate_spec(both)] == ["cache-one-of"]
    on_pvc = spec_of(
        model={"name": "m", "source": {"pvc": {"claimName": "x"}}, "cache": {"node": {}}}
    )
    assert [e.rule for e in validate_spec(on_pvc)] == ["cache-needs-hub"]


def pod_at(ip: str, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}


def test_the_progress_is_read_from_the_running_pod_of_the_job() -> None:
    pods = [pod_at("10.0.0.1", "Failed"), pod_at("10.0.0.2", deletionTimestamp="x")]
    assert progress_url(pods) is None
    pods.append(pod_at("10.0.0.3"))
    assert progress_url(pods) == "http://10.0.0.3:8001/progress"


def test_a_running_download_says_how_far_it_is_in_its_message_and_status() -> None:
    gib = 1 << 30
    progress = Progress(bytes=int(12.3 * gib), total_bytes=140 * gib, bytes_per_second=gib)
    running = download_state(job({"active": 1}), [], name="c-dl-x", progress=progress)
    assert running.message == (
        "Job c-dl-x is downloading 12.3 GiB of 140 GiB (8.8%), ~3 min left (attempt 1 of 4)"
    )
    assert download_status(running).to_json() == {
        "job": "c-dl-x",
        "state": "Running",
        "attempts": 0,
        "bytes": progress.bytes,
        "totalBytes": 140 * gib,
        "bytesPerSecond": gib,
        "progress": "12.3 GiB of 140 GiB (8.8%), ~3 min left",
    }


def test_without_a_readable_progress_status_keeps_the_job_and_its_attempt() -> None:
    running = download_state(job({"active": 1, "failed": 2}), [], name="c-dl-x")
    assert running.message == "Job c-dl-x is downloading (attempt 3 of 4)"
    assert download_status(running).to_json() == {
        "job": "c-dl-x",
        "state": "Running",
        "attempts": 2,
    }
