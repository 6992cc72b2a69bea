"""The shared model cache on the testbed: a VLLMCluster with
spec.model.cache.shared gets a ReadWriteMany claim (bound here to a hostPath
PersistentVolume) and a download Job running `shoal download` (the pod
runner plays it) against a Hub on loopback. With a wrong token the Job fails
and status says so (Degraded DownloadFailed, the 401 and the Secret to set,
replicas Downloading, no engine pod); with the right one the files are
fetched once, both replicas load them from the claim, and a restarted
replica loads them again without a download. While a (slow) download runs,
status.model.download shows its bytes rising toward the model's size, and
Progressing and `kubectl get vlc -o wide` say how far it is.

The node cache (spec.model.cache.node): the engine fetches the model into
the node's directory (the pod runner gives each kwok node its own host
directories); a replica restarted on that node loads it without fetching,
and one moved to another node fetches its own copy there."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, wait_for
from tests.e2e.operator_env import children, cluster, cluster_manifest, wait_ready
from tests.fake_hub import COMMIT, FakeHub, serve_hub, tiny_model_files

pytestmark = pytest.mark.e2e

PATTERN = "shoal-cache"
REPO = "org/tiny"
TOKEN = "hf_right"


def secret(token: str) -> dict[str, Any]:
    data = {"token": base64.b64encode(token.encode()).decode()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "data": data}


def host_volume(name: str, path: Path, storage_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": storage_class,
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
        },
    }


def conditions(bed: Testbed, ns: str) -> dict[str, dict[str, Any]]:
    found = cluster(bed, ns, "cached").get("status", {}).get("conditions", [])
    return {c["type"]: c for c in found}


def loaded_from(bed: Testbed, ns: str, pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    log = bed.logs / "pods" / f"{ns}_{meta['name']}_{meta['uid'][:8]}.log"
    return log.read_text() if log.exists() else ""


def test_the_model_is_downloaded_once_and_every_replica_and_restart_loads_it_from_the_claim(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    storage = tmp_path / "volume"
    model_dir = storage / "org--tiny"
    testbed.kubectl(
        "apply", "-f", "-", input_text=yaml.safe_dump(host_volume(f"{ns}-pv", storage, ns))
    )
    files = tiny_model_files()
    with serve_hub(FakeHub(REPO, files, token=TOKEN)) as hub:
        manifest = cluster_manifest("cached", replicas=2, tensor=1, model=REPO)
        spec = manifest["spec"]
        spec["model"]["source"] = {"hf": {"tokenSecret": {"name": "hf"}}}
        spec["model"]["cache"] = {
            "shared": {"size": "1Gi", "storageClassName": ns, "backoffLimit": 0}
        }
        spec["engine"]["env"] = [{"name": "HF_ENDPOINT", "value": hub.url}]
        apply(testbed, ns, secret("hf_wrong"), manifest)

        # A wrong token: the Job fails, status says why and what to do; no engine starts.
        degraded = wait_for(
            lambda: (
                (d := conditions(testbed, ns).get("Degraded", {})).get("reason") == "DownloadFailed"
                and d
            ),
            what="Degraded DownloadFailed",
            timeout=90,
        )
        assert "401" in degraded["message"]
        assert "spec.model.source.hf.tokenSecret" in degraded["message"]
        states = [r["state"] for r in cluster(testbed, ns, "cached")["status"]["replicaStatuses"]]
        assert states == ["Downloading", "Downloading"]
        engines = [
            p
            for p in children(testbed, ns, "cached", "pods")
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
        ]
        assert engines == []

        # The right token, and the Job again as the message says: files fetched once.
        apply(testbed, ns, secret(TOKEN))
        (job,) = children(testbed, ns, "cached", "jobs")
        testbed.kubectl("delete", "job", job["metadata"]["name"], "-n", ns)
        wait_ready(testbed, ns, "cached", 2, timeout=150)
        assert (model_dir / ".shoal-complete").exists()
        assert dict(hub.served) == {name: 1 for name in files if not name.startswith("original/")}
        leaders = _leaders(testbed, ns, "cached")
        for pod in leaders:
            assert f"loaded model from {model_dir}" in loaded_from(testbed, ns, pod)

        # A restarted replica loads the same files: no new Job, nothing fetched.
        restarted = leaders[1]
        testbed.kubectl("delete", "pod", restarted["metadata"]["name"], "-n", ns)
        wait_for(
            lambda: any(
                p["metadata"]["uid"] != restarted["metadata"]["uid"]
                and f"loaded model from {model_dir}" in loaded_from(testbed, ns, p)
                for p in _leaders(testbed, ns, "cached")
            ),
            what="the restarted replica loading the cached model",
            timeout=90,
        )
        wait_ready(testbed, ns, "cached", 2, timeout=90)
        assert len(children(testbed, ns, "cached", "jobs")) == 1
        assert dict(hub.served) == {name: 1 for name in files if not name.startswith("original/")}
    testbed.kubectl("delete", "pv", f"{ns}-pv", "--wait=false", check=False)


def test_status_shows_the_download_s_bytes_rising_toward_the_model_s_size(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    storage = tmp_path / "volume"
    testbed.kubectl(
        "apply", "-f", "-", input_text=yaml.safe_dump(host_volume(f"{ns}-pv", storage, ns))
    )
    files = tiny_model_files(weight_bytes=6 << 20)
    total = sum(len(b) for name, b in files.items() if not name.startswith("original/"))
    # About 24 s for the weights: several of the operator's looks (every 5 s).
    with serve_hub(FakeHub(REPO, files, bytes_per_second=256 << 10)) as hub:
        manifest = cluster_manifest("slow", replicas=1, tensor=1, model=REPO)
        spec = manifest["spec"]
        spec["model"]["cache"] = {"shared": {"size": "1Gi", "storageClassName": ns}}
        spec["engine"]["env"] = [{"name": "HF_ENDPOINT", "value": hub.url}]
        apply(testbed, ns, manifest)

        seen: list[dict[str, Any]] = []
        wide = ""

        def finished() -> bool:
            nonlocal wide
            status = cluster(testbed, ns, "slow").get("status", {})
            download = status.get("model", {}).get("download", {})
            if download.get("state") == "Running" and download.get("bytes") is not None:
                if not seen or seen[-1]["bytes"] != download["bytes"]:
                    seen.append(download)
                    progressing = {c["type"]: c for c in status.get("conditions", [])}.get(
                        "Progressing", {}
                    )
                    assert download["progress"] in progressing.get("message", "")
                if not wide and download["bytes"] < total:
                    wide = testbed.kubectl("get", "vlc", "slow", "-n", ns, "-o", "wide")
            return bool(download.get("state") == "Complete")

        wait_for(finished, what="the download complete", timeout=120, interval=0.5)
        wait_ready(testbed, ns, "slow", 1, timeout=90)

    byte_counts = [d["bytes"] for d in seen]
    assert len([b for b in byte_counts if 0 < b < total]) >= 2, seen
    assert byte_counts == sorted(byte_counts), seen
    assert {d["totalBytes"] for d in seen} == {total}
    last = [d for d in seen if d["bytes"] < total][-1]
    assert last["bytesPerSecond"] > 0 and "of 6.00 MiB (" in last["progress"], seen
    assert "left" in last["progress"]
    header, row = wide.splitlines()[:2]
    assert "DOWNLOAD" in header and " of 6.00 MiB (" in row
    testbed.kubectl("delete", "pv", f"{ns}-pv", "--wait=false", check=False)


def test_a_node_cache_serves_restarts_on_its_node_and_another_node_fetches_its_own(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "node-cache"
    files = tiny_model_files()
    once = {name: 1 for name in files if not name.startswith("original/")}

    def snapshot(node: str) -> Path:
        return cache_dir / node / "hub" / "models--org--tiny" / "snapshots" / COMMIT

    def leader_loaded(node: str, *, fetched: int, not_uid: str = "") -> dict[str, Any] | None:
        """The leader on node that loaded the model after fetching that many files."""
        for pod in _leaders(testbed, ns, "local"):
            log = loaded_from(testbed, ns, pod)
            if (
                pod["metadata"]["uid"] != not_uid
                and pod["spec"].get("nodeName") == node
                and f"{fetched} files fetched from the Hub" in log
                and "loaded model from" in log
            ):
                return pod
        return None

    with serve_hub(FakeHub(REPO, files)) as hub:
        manifest = cluster_manifest("local", replicas=1, tensor=1, model=REPO)
        spec = manifest["spec"]
        spec["model"]["cache"] = {"node": {"path": str(cache_dir)}}
        spec["engine"]["env"] = [{"name": "HF_ENDPOINT", "value": hub.url}]
        spec["placement"] = {"nodeSelector": {"kubernetes.io/hostname": "gpu-h100-1"}}
        apply(testbed, ns, manifest)
        first = wait_for(
            lambda: leader_loaded("gpu-h100-1", fetched=len(once)),
            what="the engine on gpu-h100-1 fetching the model into the node's cache",
            timeout=120,
        )
        wait_ready(testbed, ns, "local", 1, timeout=90)
        assert dict(hub.served) == once

        # Restarted on the same node: loaded from the node's directory, nothing fetched.
        testbed.kubectl("delete", "pod", first["metadata"]["name"], "-n", ns)
        wait_for(
            lambda: leader_loaded("gpu-h100-1", fetched=0, not_uid=first["metadata"]["uid"]),
            what="the restarted engine loading the node's cached model",
            timeout=120,
        )
        wait_ready(testbed, ns, "local", 1, timeout=90)
        assert dict(hub.served) == once

        # On another node the cache is that node's, empty: the engine fetches its own.
        spec["placement"] = {"nodeSelector": {"kubernetes.io/hostname": "gpu-h100-2"}}
        apply(testbed, ns, manifest)
        wait_for(
            lambda: leader_loaded("gpu-h100-2", fetched=len(once)),
            what="the engine moved to gpu-h100-2 fetching the model there",
            timeout=150,
        )
        wait_ready(testbed, ns, "local", 1, timeout=90)
        assert dict(hub.served) == {name: 2 for name in once}
    # Each node's copy is in its own directory, at huggingface_hub's paths.
    assert f"loaded model from {snapshot('gpu-h100-1')}" in loaded_from(testbed, ns, first)
    for node in ("gpu-h100-1", "gpu-h100-2"):
        assert (snapshot(node) / "model.safetensors").is_file()


def _leaders(bed: Testbed, ns: str, name: str) -> list[dict[str, Any]]:
    found = [
        p
        for p in children(bed, ns, name, "pods")
        if p["metadata"]["labels"].get("serving.shoal.dev/role") == "leader"
        and not p["metadata"].get("deletionTimestamp")
    ]
    return sorted(found, key=lambda p: p["metadata"]["name"])
