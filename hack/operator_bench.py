"""Measure the operator on the testbed (`make bench-operator`; needs `make testbed-up`).

1. Time from `kubectl apply` of a 2-replica TP4 VLLMCluster to all its objects
   existing, and to READY 2 (simulated engines run by the pod runner).
2. Reconcile passes and API writes per change (create, idle, scale, image
   change, router-only change, delete), from the API server's audit log:
   the operator's own requests carry the user agents `shoal-operator/...`
   and `kopf/...`; one pass lists the cluster's StatefulSets exactly once.
3. Operator RSS with 50 VLLMClusters of 4 replicas each. Extra fake GPU nodes
   are added for them; their engine image is not a vLLM one, so the pod runner
   starts nothing, and one `shoal sim` process answers at all 200 leader pod
   IPs instead (routers are scaled to 0), keeping the machine usable.

Prints a report; nothing here is a test and nothing asserts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from shoal.procs import LocalProcess, start_operator, start_sim, wait_until
from shoal_testbed import nodes
from shoal_testbed.cluster import DEFAULT_DIR, REPO, Testbed

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
BENCH_PRODUCT = "BENCH-GPU"


def cluster(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "model": {"name": MODEL},
        "replicas": 2,
        "parallelism": {"tensor": 4},
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": 8192, "extraArgs": ["--sim-time-scale", "50"]},
        **spec,
    }
    return {
        "apiVersion": "serving.shoal.dev/v1alpha1",
        "kind": "VLLMCluster",
        "metadata": {"name": name},
        "spec": body,
    }


class Bench:
    def __init__(self, bed: Testbed, work: Path) -> None:
        self.bed = bed
        self.work = work
        self.operator: LocalProcess | None = None

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        return self.bed.kubectl(*args, input_text=input_text)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, ns: str, *manifests: dict[str, Any]) -> None:
        self.kubectl("apply", "-n", ns, "-f", "-", input_text=yaml.safe_dump_all(manifests))

    def start_operator(self) -> None:
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            str(REPO / "charts/shoal/crds/vllmclusters.serving.shoal.dev.yaml"),
        )
        self.operator = start_operator(
            kubeconfig=self.bed.kubeconfig,
            namespaces=["shoal-bench-*"],
            log=self.work / "operator.log",
        )
        time.sleep(3)

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()

    def rss(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) of the operator in KiB."""
        assert self.operator is not None
        fields = {}
        for line in Path(f"/proc/{self.operator.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def namespace(self) -> str:
        name = f"shoal-bench-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        wait_until(
            lambda: self.kubectl("get", "sa", "default", "-n", name),
            what=f"the default ServiceAccount in {name}",
        )
        return name

    def audit_offset(self) -> int:
        return (self.bed.logs / "audit.log").stat().st_size

    def operator_requests(self, ns: str, offset: int) -> tuple[int, Counter[str]]:
        """(passes, writes by verb and resource) of the operator in ns since offset."""
        passes, writes = 0, Counter[str]()
        with open(self.bed.logs / "audit.log") as log:
            log.seek(offset)
            for line in log:
                entry = json.loads(line)
                ref = entry.get("objectRef", {})
                agent = entry.get("userAgent", "")
                if entry.get("stage") != "ResponseComplete" or ref.get("namespace") != ns:
                    continue
                if not agent.startswith(("shoal-operator", "kopf")):
                    continue
                verb = entry["verb"]
                if verb == "list" and ref.get("resource") == "statefulsets":
                    passes += 1
                elif verb not in ("get", "list", "watch"):
                    resource = ref.get("resource", "")
                    if ref.get("subresource"):
                        resource += "/" + ref["subresource"]
                    writes[f"{verb} {resource}"] += 1
        return passes, writes

    def ready(self, ns: str, name: str, replicas: int) -> bool:
        status = self.json("vllmcluster", name, "-n", ns).get("status", {})
        return status.get("warmReplicas") == replicas and status.get("replicas") == replicas


def creation_seconds(bench: Bench, ns: str, name: str, offset: int) -> float:
    """From the API server's receipt of the VLLMCluster's create to the last of
    its children's first apply completing, by the audit log's timestamps."""
    created: str | None = None
    first_apply: dict[str, str] = {}
    with open(bench.bed.logs / "audit.log") as log:
        log.seek(offset)
        for line in log:
            entry = json.loads(line)
            ref = entry.get("objectRef", {})
            if ref.get("namespace") != ns or entry.get("stage") != "ResponseComplete":
                continue
            if entry["verb"] == "create" and ref.get("resource") == "vllmclusters":
                if ref.get("name") == name:
                    created = entry["requestReceivedTimestamp"]
            elif (
                entry["verb"] == "patch"
                and entry.get("userAgent", "").startswith("shoal-operator")
                and not ref.get("subresource")
                and ref.get("resource") != "vllmclusters"
            ):
                key = f"{ref['resource']}/{ref['name']}"
                first_apply.setdefault(key, entry["stageTimestamp"])
    assert created is not None and len(first_apply) == 10, (created, first_apply)
    return (_time(max(first_apply.values())) - _time(created)).total_seconds()


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def measure_apply(bench: Bench, runs: int) -> None:
    print(f"\n## 1. kubectl apply -> all objects created / READY 2 ({runs} runs, 2 x TP4)")
    ns = bench.namespace()
    for run in range(runs):
        name = f"apply{run}"
        offset = bench.audit_offset()
        start = time.monotonic()
        bench.apply(ns, cluster(name))
        wait_until(
            lambda name=name: bench.ready(ns, name, 2),
            what=f"{name} READY 2",
            timeout=120,
            interval=0.1,
        )
        ready = time.monotonic() - start  # wall time from before kubectl apply
        time.sleep(1)  # let the audit log catch up
        created = creation_seconds(bench, ns, name, offset)
        print(
            f"run {run}: all 10 objects created {created:.2f}s after the API server got "
            f"the VLLMCluster; READY 2 (polled, 0.1s) {ready:.2f}s after running kubectl apply"
        )
        bench.kubectl("delete", "vllmcluster", name, "-n", ns, "--wait=true")
    bench.kubectl("delete", "namespace", ns, "--wait=false")


def measure_changes(bench: Bench, idle_seconds: float) -> None:
    print("\n## 2. reconcile passes and operator writes per change (audit log)")
    ns = bench.namespace()
    name = "changes"

    def phase(title: str, action: Any, done: Any, settle: float = 3.0) -> None:
        offset = bench.audit_offset()
        action()
        wait_until(done, what=f"{title} done", timeout=180, interval=0.2)
        time.sleep(settle)
        passes, writes = bench.operator_requests(ns, offset)
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(writes.items())) or "none"
        print(f"{title}: {passes} passes, {sum(writes.values())} writes ({listed})")

    phase(
        "create 2 x TP4", lambda: bench.apply(ns, cluster(name)), lambda: bench.ready(ns, name, 2)
    )
    phase(f"idle {idle_seconds:.0f}s", lambda: time.sleep(idle_seconds), lambda: True, settle=0)
    phase(
        "scale 2 -> 3",
        lambda: bench.kubectl("scale", f"vllmcluster/{name}", "-n", ns, "--replicas=3"),
        lambda: bench.ready(ns, name, 3),
    )
    image = "vllm/vllm-openai:v0.32.1"

    def rolled() -> bool:
        pods = bench.json(
            "pods",
            "-n",
            ns,
            "-l",
            f"serving.shoal.dev/cluster={name},serving.shoal.dev/role=leader",
        )
        images = [p["spec"]["containers"][0]["image"] for p in pods["items"]]
        return images == [image] * 3 and bench.ready(ns, name, 3)

    def patch(spec: dict[str, Any]) -> None:
        change = json.dumps({"spec": spec})
        bench.kubectl("patch", "vllmcluster", name, "-n", ns, "--type=merge", "-p", change)

    phase("image change (3 replicas)", lambda: patch({"image": image}), rolled)
    phase(
        "router-only change",
        lambda: patch({"router": {"policy": "round-robin"}}),
        lambda: True,
        settle=5,
    )
    phase(
        "delete",
        lambda: bench.kubectl("delete", "vllmcluster", name, "-n", ns, "--wait=true"),
        lambda: True,
    )
    bench.kubectl("delete", "namespace", ns, "--wait=false")


def measure_rss(bench: Bench, clusters: int, replicas: int, idle_seconds: float) -> None:
    print(f"\n## 3. operator RSS with {clusters} VLLMClusters x {replicas} replicas")
    octet = bench.bed.state.pod_octet if bench.bed.state else 100
    needed = clusters * replicas
    shapes = tuple(
        nodes.NodeShape(f"bench-gpu-{i}", 8, BENCH_PRODUCT) for i in range((needed + 7) // 8)
    )
    # Pod CIDRs after the testbed's own nodes' (127.<octet>.1-6.0/24).
    bench_nodes = [nodes.build_node(s, index=20 + i, octet=octet) for i, s in enumerate(shapes)]
    bench.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(bench_nodes))
    ns = bench.namespace()
    rss_before, _ = bench.rss()
    sim: LocalProcess | None = None
    try:
        start = time.monotonic()
        manifests = [
            cluster(
                f"c{i:02d}",
                model={"name": "meta-llama/Llama-3.1-8B-Instruct"},
                replicas=replicas,
                image="bench/engine:1",  # no "vllm": the pod runner leaves these pods alone
                parallelism={"tensor": 1},
                gpu={"product": BENCH_PRODUCT},
                router={"replicas": 0},
            )
            for i in range(clusters)
        ]
        bench.apply(ns, *manifests)
        selector = "serving.shoal.dev/role=leader"

        def spec_valid() -> bool:
            status = bench.json("vllmcluster", "c00", "-n", ns).get("status", {})
            found = {c["type"]: c for c in status.get("conditions", [])}
            if found.get("SpecValid", {}).get("status") == "False":
                raise RuntimeError(found["SpecValid"]["message"])
            return "SpecValid" in found

        wait_until(spec_valid, what="c00's SpecValid condition", interval=0.5)

        def leader_ips() -> list[str]:
            items = bench.json("pods", "-n", ns, "-l", selector)["items"]
            ips = [p["status"].get("podIP") for p in items if p["status"].get("phase") == "Running"]
            return [ip for ip in ips if ip]

        wait_until(
            lambda: len(leader_ips()) == needed,
            what=f"{needed} leader pods Running",
            timeout=300,
            interval=1.0,
        )
        sim = start_sim(
            [MODEL, "--max-model-len", "8192"],
            log=bench.work / "sim.log",
            listen=[f"{ip}:8000" for ip in leader_ips()],
        )

        def all_ready() -> bool:
            items = bench.json("vllmclusters", "-n", ns)["items"]
            return (
                sum(1 for c in items if c.get("status", {}).get("warmReplicas") == replicas)
                == clusters
            )

        wait_until(all_ready, what=f"{clusters} clusters READY", timeout=600, interval=2.0)
        print(f"{clusters} clusters READY {replicas} after {time.monotonic() - start:.0f}s")
        time.sleep(5)
        offset = bench.audit_offset()
        samples = []
        for _ in range(int(idle_seconds // 5)):
            time.sleep(5)
            samples.append(bench.rss()[0])
        rss, peak = bench.rss()
        passes, writes = bench.operator_requests(ns, offset)
        print(f"operator RSS before: {rss_before / 1024:.0f} MiB")
        print(
            f"operator RSS idle with {clusters} clusters: {rss / 1024:.0f} MiB "
            f"(min {min(samples) / 1024:.0f}, max {max(samples) / 1024:.0f} "
            f"over {idle_seconds:.0f}s); "
            f"peak (VmHWM) {peak / 1024:.0f} MiB"
        )
        print(
            f"idle {idle_seconds:.0f}s: {passes} passes (resyncs), "
            f"{sum(writes.values())} writes {dict(writes)}"
        )
    finally:
        bench.kubectl("delete", "vllmclusters", "--all", "-n", ns, "--wait=true", "--timeout=300s")
        if sim is not None:
            sim.stop()
        # Pods first, while kwok still manages their nodes and can finish deleting them.
        bench.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s")
        bench.kubectl(
            "delete", "nodes", *(n["metadata"]["name"] for n in bench_nodes), "--wait=false"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="testbed state directory")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--idle-seconds", type=float, default=70.0, help="> one resync (60s)")
    parser.add_argument("--skip", action="append", default=[], choices=["apply", "changes", "rss"])
    args = parser.parse_args()
    bed = Testbed.attach(args.dir)
    if bed is None:
        print("no testbed running: run `make testbed-up` first", file=sys.stderr)
        return 1
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"operator-bench-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    bench = Bench(bed, work)
    bench.start_operator()
    try:
        if "apply" not in args.skip:
            measure_apply(bench, args.runs)
        if "changes" not in args.skip:
            measure_changes(bench, args.idle_seconds)
        if "rss" not in args.skip:
            measure_rss(bench, args.clusters, args.replicas, args.idle_seconds)
    finally:
        bench.stop_operator()
        print(f"\nlogs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
