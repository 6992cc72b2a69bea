"""The operator's fault suite (issue 18), on the real control plane:

- SIGKILLed at each phase of a scale up (the new replica's StatefulSet
  written, before it is warm), of a scale down (the drain begun; the
  StatefulSet deleted) and of a rollout (replica 0's new template written,
  not yet warm; between replicas, replica 1 just marked for replacement),
  then started again;
- the API server restarted mid-rollout;
- children deleted while the operator is down;
- the VLLMCluster deleted while the operator is down;
- a pass killed right after it acted keeps its Event (the scale up).

Every case converges: status matches the fleet (observedGeneration and each
condition's at the generation, Ready, Progressing=False Stable, Degraded and
SpecValid as they should be, counts, every replica Serving), the spec's
replica count, the new template everywhere after a rollout, no duplicate
children and nothing without its owner. How long convergence took is
recorded: the table is printed at the end of the run and kept in
.testbed/logs/operator-faults.txt (bounds here are generous: they check
behaviour, not speed).

A phase is hit right after one exact step: the API server's audit log is
followed (shoal_testbed.audit) and the operator is SIGSTOPped the moment the
API server has answered the write that starts the phase, then SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shoal.controller.names import LABEL_CLUSTER, LABEL_COMPONENT
from shoal.procs import LocalProcess
from shoal_testbed.audit import AuditTail, Request, freeze_at
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import apply, get_json, namespace
from tests.e2e.operator_env import (
    CHILD_KINDS,
    REPO,
    cluster,
    cluster_manifest,
    delete_clusters,
    events,
    install_crd,
    operator,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-flt"
NAME = "fleet"
OPERATOR_AGENT = "shoal-operator"
# Generous: convergence takes seconds; a loaded CI machine may take many more.
CONVERGE_SECONDS = 150
PHASE_SECONDS = 90
# Children left in a namespace that goes as the operator starts.
LEFT_CHILDREN = 400
TABLE = REPO / ".testbed" / "logs" / "operator-faults.txt"
STARTED_LINE = "Initial authentication has finished"  # kopf's, once it can watch


@dataclass
class Timings:
    # case, seconds to converge, of which the new operator's start-up (None: not restarted)
    rows: list[tuple[str, float, float | None]] = field(default_factory=list)

    def table(self) -> str:
        width = max([len(row[0]) for row in self.rows] + [4])
        lines = [
            f"{'case':<{width}}  converged in  of which operator start-up",
            f"{'-' * width}  ------------  --------------------------",
        ]
        for case, seconds, startup in self.rows:
            start = "-" if startup is None else f"{startup:.1f} s"
            lines.append(f"{case:<{width}}  {seconds:10.1f} s  {start:>26}")
        return "\n".join(lines)


@pytest.fixture(scope="module")
def timings(request: pytest.FixtureRequest) -> Iterator[Timings]:
    found = Timings()
    yield found
    if not found.rows:
        return
    table = found.table()
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(table + "\n")
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():  # to the terminal, not the captured output
        reporter.write_line("")
        reporter.write_line("operator fault suite, convergence after each fault:")
        for line in table.splitlines():
            reporter.write_line(line)
        reporter.write_line(f"(also in {TABLE})")


@dataclass
class Bench:
    """One namespace, and the operator watching it, which tests kill and start."""

    bed: Testbed
    ns: str
    log: Path
    process: LocalProcess | None = None
    started: tuple[float, int] = (0.0, 0)  # wall clock, log offset at the last start

    def start(self) -> None:
        assert self.process is None or not self.process.alive()
        self.started = (time.time(), self.log.stat().st_size if self.log.exists() else 0)
        self.process = operator(self.bed, self.log, namespaces=[f"{PATTERN}-*"])

    def startup_seconds(self) -> float | None:
        """From the last start until kopf had logged in (its log's clock)."""
        wall, offset = self.started
        with open(self.log, errors="replace") as log:
            log.seek(offset)
            for line in log:
                if STARTED_LINE in line:
                    moment = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
                    return round(time.mktime(moment) + float("0." + line[20:23]) - wall, 1)
        return None

    def diagnosis(self, lines: int = 60) -> str:
        """What a failed case leaves to read: the operator's last log lines
        (pytest's temporary directories are rotated away by later runs),
        the cluster's Events and its children."""
        log = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        raw = self.bed.kubectl(
            "get", "events", "-n", self.ns, "--sort-by=.lastTimestamp", check=False
        )
        children = self.bed.kubectl("get", "pods,statefulsets", "-n", self.ns, check=False)
        return "\n".join(
            [f"operator log, last {lines} lines:", *log[-lines:], "events:", raw, children]
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process = None

    def audit(self) -> AuditTail:
        return AuditTail(self.bed.logs / "audit.log")

    def kill_at(self, tail: AuditTail, match: Callable[[Request], bool], *, what: str) -> None:
        """SIGKILL the operator right as the API server receives its write."""
        assert self.process is not None
        freeze_at(
            tail,
            self.process.pid,
            lambda r: (
                r.user_agent.startswith(OPERATOR_AGENT) and r.namespace == self.ns and match(r)
            ),
            what=what,
            timeout=PHASE_SECONDS,
        )
        self.kill()

    def patch(self, spec: dict[str, Any]) -> None:
        body = json.dumps({"spec": spec})
        self.bed.kubectl("patch", "vllmcluster", NAME, "-n", self.ns, "--type=merge", "-p", body)


@pytest.fixture
def bench(testbed: Testbed, tmp_path: Path) -> Iterator[Bench]:
    install_crd(testbed)
    with namespace(testbed, PATTERN) as ns:
        found = Bench(testbed, ns, tmp_path / "operator.log")
        try:
            yield found
        finally:
            # Clusters go while an operator runs, so their finalizers go with them.
            if found.process is None or not found.process.alive():
                found.start()
            delete_clusters(testbed, ns)
            found.stop()


def _fleet(bench: Bench, replicas: int) -> None:
    bench.start()
    apply(bench.bed, bench.ns, cluster_manifest(NAME, replicas=replicas, tensor=4))
    wait_ready(bench.bed, bench.ns, NAME, replicas, timeout=CONVERGE_SECONDS)


def _labelled(bed: Testbed, ns: str, kind: str) -> list[dict[str, Any]]:
    return _children(bed, ns, (kind,))[kind]


def _children(
    bed: Testbed, ns: str, kinds: tuple[str, ...] = (*CHILD_KINDS, "replicasets")
) -> dict[str, list[dict[str, Any]]]:
    """The cluster's children by kind (kubectl's plural), in one request."""
    listed = get_json(bed, ",".join(kinds), "-n", ns, "-l", f"{LABEL_CLUSTER}={NAME}")
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    plural = {kind.rstrip("s").lower(): kind for kind in kinds}
    for item in listed["items"]:
        found[plural[item["kind"].lower()]].append(item)
    return found


def _engine_env(pod_spec: dict[str, Any]) -> dict[str, str]:
    engine = next(c for c in pod_spec["containers"] if c["name"] == "engine")
    return {e["name"]: str(e.get("value")) for e in engine.get("env") or [] if "name" in e}


def _runs(pod_spec: dict[str, Any], env: dict[str, str]) -> bool:
    """The pod spec's engine has env (among shoal's own variables)."""
    found = _engine_env(pod_spec)
    return all(found.get(k) == v for k, v in env.items())


def problems(bed: Testbed, ns: str, *, replicas: int, env: dict[str, str]) -> list[str]:
    """What keeps the fleet from having converged on its spec (none: it has)."""
    found: list[str] = []
    vlc = cluster(bed, ns, NAME)
    generation = vlc["metadata"]["generation"]
    status = vlc.get("status") or {}
    if status.get("observedGeneration") != generation:
        found.append(f"observedGeneration {status.get('observedGeneration')} != {generation}")
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    for kind, (state, reason) in WANTED_CONDITIONS.items():
        got = conditions.get(kind, {})
        if got.get("status") != state or (reason and got.get("reason") != reason):
            found.append(f"{kind}={got.get('status')} {got.get('reason')}: {got.get('message')}")
        if got and got.get("observedGeneration") != generation:
            found.append(f"{kind} of generation {got.get('observedGeneration')}")
    for count in ("replicas", "readyReplicas", "warmReplicas"):
        if status.get(count) != replicas:
            found.append(f"status.{count} {status.get(count)} != {replicas}")
    entries = [(e.get("index"), e.get("state")) for e in status.get("replicaStatuses") or []]
    if entries != [(i, "Serving") for i in range(replicas)]:
        found.append(f"replicaStatuses {entries}")

    kids = _children(bed, ns)
    sets = kids["statefulsets"]
    if _names(sets) != [f"{NAME}-r{i}" for i in range(replicas)]:
        found.append(f"StatefulSets {_names(sets)}")
    for sts in sets:
        if not _runs(sts["spec"]["template"]["spec"], env):
            found.append(f"StatefulSet {sts['metadata']['name']} not on the spec's template")
    engines = [p for p in kids["pods"] if p["metadata"]["labels"].get(LABEL_COMPONENT) == "engine"]
    if _names(engines) != [f"{NAME}-r{i}-0" for i in range(replicas)]:
        found.append(f"engine pods {_names(engines)}")
    for pod in engines:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            found.append(f"pod {name} terminating")
        if not _runs(pod["spec"], env):
            found.append(f"pod {name} runs an old template")
    if _names(kids["deployments"]) != [f"{NAME}-router"]:
        found.append(f"router Deployments {_names(kids['deployments'])}")
    live_sets = [r for r in kids["replicasets"] if r["spec"].get("replicas")]
    if len(live_sets) != 1:
        found.append(f"{len(live_sets)} router ReplicaSets with pods")
    found += orphans(kids, uid=vlc["metadata"]["uid"])
    return found


WANTED_CONDITIONS = {
    "Ready": ("True", None),
    "Progressing": ("False", "Stable"),
    "Degraded": ("False", None),
    "SpecValid": ("True", None),
}


def _names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in items)


def orphans(kids: dict[str, list[dict[str, Any]]], *, uid: str) -> list[str]:
    """Children not owned by the cluster (uid) or, pods, by a live StatefulSet
    or ReplicaSet."""
    found = []
    owners = {o["metadata"]["uid"] for kind in ("statefulsets", "replicasets") for o in kids[kind]}
    for kind, items in kids.items():
        for item in items:
            meta = item["metadata"]
            refs = {ref["uid"] for ref in meta.get("ownerReferences") or []}
            name = f"{kind}/{meta['name']}"
            if kind == "pods" and not refs & owners and not meta.get("deletionTimestamp"):
                found.append(f"orphan {name}")
            elif kind not in ("pods", "replicasets") and uid not in refs:
                found.append(f"orphan {name} (owners {sorted(refs)})")
    return found


def converge(
    timings: Timings,
    case: str,
    bench: Bench,
    *,
    since: float,
    replicas: int,
    env: dict[str, str] | None = None,
    restarted: bool = True,
) -> None:
    """Wait until the fleet has converged; record how long it took from
    `since` (monotonic), and how much of it the operator took to start."""
    deadline = time.monotonic() + CONVERGE_SECONDS
    found = ["not looked yet"]
    while time.monotonic() < deadline:
        found = problems(bench.bed, bench.ns, replicas=replicas, env=env or {})
        if not found:
            startup = bench.startup_seconds() if restarted else None
            timings.rows.append((case, round(time.monotonic() - since, 1), startup))
            return
        time.sleep(1.0)
    raise AssertionError(
        f"{case}: not converged in {CONVERGE_SECONDS}s: {found}\n{bench.diagnosis()}"
    )


def _is_set(name: str, *, verb: str = "patch") -> Callable[[Request], bool]:
    return lambda r: r.resource == "statefulsets" and r.name == name and r.verb == verb


def test_an_operator_killed_right_after_scaling_up_converges_and_keeps_its_event(
    bench: Bench, timings: Timings
) -> None:
    """Killed as the new replica's StatefulSet is written, before it is warm
    and before the pass would go on to post anything: the restarted operator
    completes the fleet, and the Event for the replica is there."""
    _fleet(bench, 1)
    tail = bench.audit()
    bench.patch({"replicas": 2})
    bench.kill_at(tail, _is_set(f"{NAME}-r1"), what="replica 1's StatefulSet written")
    started = time.monotonic()
    bench.start()
    converge(timings, "scale up 1->2, killed at r1's StatefulSet", bench, since=started, replicas=2)
    told = [(e["reason"], e["message"]) for e in events(bench.bed, bench.ns, NAME)]
    assert [m for reason, m in told if reason == "ReplicaCreated" and "replica 1" in m], told


def test_an_operator_killed_as_a_scale_down_begins_its_drain_converges(
    bench: Bench, timings: Timings
) -> None:
    """Killed as replica 1 is taken out of rotation to drain: the new
    operator drains it again (its grace period starts over) and removes it."""
    _fleet(bench, 2)
    tail = bench.audit()
    bench.patch({"replicas": 1})
    bench.kill_at(
        tail,
        lambda r: r.resource == "pods" and r.name == f"{NAME}-r1-0" and r.subresource == "status",
        what="replica 1's drain begun",
    )
    started = time.monotonic()
    bench.start()
    converge(timings, "scale down 2->1, killed at the drain", bench, since=started, replicas=1)


def test_an_operator_killed_as_it_deletes_a_drained_replica_converges(
    bench: Bench, timings: Timings
) -> None:
    """Killed as replica 1's StatefulSet is deleted, before status says so:
    the new operator's status drops it."""
    _fleet(bench, 2)
    tail = bench.audit()
    bench.patch({"replicas": 1})
    bench.kill_at(
        tail, _is_set(f"{NAME}-r1", verb="delete"), what="replica 1's StatefulSet deleted"
    )
    started = time.monotonic()
    bench.start()
    converge(timings, "scale down 2->1, killed at the delete", bench, since=started, replicas=1)


def _roll(bench: Bench, value: str) -> dict[str, str]:
    env = {"SHOAL_FAULT_ROLL": value}
    bench.patch({"engine": {"env": [{"name": k, "value": v} for k, v in env.items()]}})
    return env


def test_an_operator_killed_as_a_rollout_writes_the_first_template_converges_on_it(
    bench: Bench, timings: Timings
) -> None:
    """Killed as replica 0's new template is written (after its marks),
    before its pod is replaced and warm."""
    _fleet(bench, 2)
    tail = bench.audit()
    env = _roll(bench, "1")
    bench.kill_at(
        tail,
        lambda r: _is_set(f"{NAME}-r0")(r) and r.server_side_apply,
        what="replica 0's new template written",
    )
    sts = get_json(bench.bed, "statefulset", f"{NAME}-r0", "-n", bench.ns)
    assert _runs(sts["spec"]["template"]["spec"], env), "replica 0's template not written"
    started = time.monotonic()
    bench.start()
    converge(timings, "rollout, killed at r0's template", bench, since=started, replicas=2, env=env)


def test_an_operator_killed_between_replicas_of_a_rollout_converges_on_the_new_template(
    bench: Bench, timings: Timings
) -> None:
    """Killed with replica 0 done and warm and replica 1 just marked for
    replacement (its marks written, not its template)."""
    _fleet(bench, 2)
    tail = bench.audit()
    env = _roll(bench, "1")
    bench.kill_at(
        tail,
        lambda r: _is_set(f"{NAME}-r1")(r) and not r.server_side_apply,
        what="replica 1 marked for replacement",
    )
    pod = get_json(bench.bed, "pod", f"{NAME}-r0-0", "-n", bench.ns)
    assert _runs(pod["spec"], env), "replica 0 was not done when replica 1 began"
    started = time.monotonic()
    bench.start()
    converge(
        timings, "rollout, killed between r0 and r1", bench, since=started, replicas=2, env=env
    )


def test_an_api_server_restart_mid_rollout_converges_on_the_new_template(
    bench: Bench, timings: Timings
) -> None:
    _fleet(bench, 2)
    tail = bench.audit()
    env = _roll(bench, "1")
    tail.wait(
        lambda r: (
            r.user_agent.startswith(OPERATOR_AGENT)
            and r.namespace == bench.ns
            and _is_set(f"{NAME}-r0")(r)
            and r.server_side_apply
            and r.stage == "ResponseComplete"
        ),
        what="replica 0's new template written",
        timeout=PHASE_SECONDS,
    )
    started = time.monotonic()
    bench.bed.restart_apiserver(down_seconds=3)
    converge(
        timings,
        "API server restart mid-rollout",
        bench,
        since=started,
        replicas=2,
        env=env,
        restarted=False,
    )
    assert bench.process is not None and bench.process.alive(), "the operator died with it"


def test_a_watched_namespace_that_goes_as_the_operator_starts_does_not_stall_it(
    bench: Bench, timings: Timings
) -> None:
    """A namespace matching the operator's glob goes while the operator is
    still taking in its children there (a finished test's, a team's CI
    namespace): clusters in the other namespaces are still reconciled. With
    kopf's indexes, a watcher stopped before it had seen the end of its list
    held every handler for good (a CI run: a restarted operator did nothing
    for 150 s). Many children make the list long to take in, and the
    operator is stopped as it is answered, until the namespace has gone."""
    gone = f"{PATTERN}-gone-{uuid.uuid4().hex[:6]}"
    bed = bench.bed
    bed.kubectl("create", "namespace", gone)
    try:
        maps = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"left-{i}", "labels": {LABEL_CLUSTER: "left"}},
            }
            for i in range(LEFT_CHILDREN)
        ]
        apply(bed, gone, *maps)
        tail = bench.audit()
        started = time.monotonic()
        bench.start()
        assert bench.process is not None
        pid = bench.process.pid
        freeze_at(
            tail,
            pid,
            lambda r: r.verb == "list" and r.resource == "configmaps" and r.namespace == gone,
            what=f"the operator's list of ConfigMaps in {gone}",
            timeout=PHASE_SECONDS,
        )
        try:
            bed.kubectl("delete", "namespace", gone, "--timeout=90s")
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        bed.kubectl("delete", "namespace", gone, "--wait=false", check=False)
    apply(bed, bench.ns, cluster_manifest(NAME, replicas=1, tensor=4))
    converge(timings, "a watched namespace gone at start-up", bench, since=started, replicas=1)


def test_children_deleted_while_the_operator_is_down_come_back(
    bench: Bench, timings: Timings
) -> None:
    _fleet(bench, 1)
    before = {kind: _names(items) for kind, items in _children(bench.bed, bench.ns).items()}
    bench.kill()
    deleted = [
        ("statefulset", f"{NAME}-r0"),
        ("deployment", f"{NAME}-router"),
        ("service", f"{NAME}-router"),
        ("configmap", f"{NAME}-router"),
        ("service", f"{NAME}-engines"),
        ("poddisruptionbudget", f"{NAME}-engines"),
    ]
    for kind, name in deleted:
        bench.bed.kubectl("delete", kind, name, "-n", bench.ns, "--wait=false")
    started = time.monotonic()
    bench.start()
    converge(timings, "children deleted, operator down", bench, since=started, replicas=1)
    after = {kind: _names(items) for kind, items in _children(bench.bed, bench.ns).items()}
    # Pods and ReplicaSets are made anew under new names; every other name is back.
    kept = ("pods", "replicasets")
    assert {k: v for k, v in after.items() if k not in kept} == {
        k: v for k, v in before.items() if k not in kept
    }
    # A new operator process still tells that it made them again.
    restored = [
        e["message"] for e in events(bench.bed, bench.ns, NAME) if e["reason"] == "ChildRestored"
    ]
    for kind in (
        "Service/fleet-router",
        "ConfigMap/fleet-router",
        "PodDisruptionBudget/fleet-engines",
    ):
        assert [m for m in restored if m.startswith(f"{kind} was deleted")], (kind, restored)


def test_a_vllmcluster_deleted_while_the_operator_is_down_leaves_no_orphans(
    bench: Bench, timings: Timings
) -> None:
    """kube-controller-manager's garbage collector runs on the testbed (all
    controllers): once the restarted operator lets the cluster go (its
    finalizer), every child goes by its owner reference."""
    _fleet(bench, 1)
    bench.kill()
    bench.bed.kubectl("delete", "vllmcluster", NAME, "-n", bench.ns, "--wait=false")
    # The finalizer holds it (and so its children) until an operator runs.
    assert cluster(bench.bed, bench.ns, NAME)["metadata"].get("deletionTimestamp")
    started = time.monotonic()
    bench.start()
    deadline = started + CONVERGE_SECONDS
    left: list[str] = ["not looked yet"]
    while time.monotonic() < deadline:
        gone = not get_json(bench.bed, "vllmclusters", "-n", bench.ns)["items"]
        left = [
            f"{kind}/{name}"
            for kind, items in _children(bench.bed, bench.ns).items()
            for name in _names(items)
        ]
        if gone and not left:
            break
        time.sleep(1.0)
    else:
        raise AssertionError(f"left behind after the cluster's deletion: {left}")
    seconds = round(time.monotonic() - started, 1)
    timings.rows.append(("cluster deleted, operator down", seconds, bench.startup_seconds()))
