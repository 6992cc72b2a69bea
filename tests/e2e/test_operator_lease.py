"""One operator at a time (`shoal operator --lease`, the chart's default), on
the real control plane. Two operators on the same clusters without it act
twice: each posts every Event, runs every warm-up, replaces replicas for a
rollout by its own count of what is in flight and restarts a hung replica.
Seen here before the Lease: two operators on one VLLMCluster of 2 replicas
posted ReplicaCreated, ReplicaReplacing and ReplicaAdmitted twice each.
A second operator comes from standby replicas, a lost node's pod still
running, or someone running `shoal operator` beside the chart's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shoal.controller.election import API_VERSION, KIND
from shoal.controller.kube import KubeApi
from shoal.controller.leading import wait_to_lead
from shoal.controller.lease import LeaseLock
from shoal.procs import LocalProcess, free_ports, start_operator
from shoal_testbed.cluster import Testbed
from tests.e2e.blackhole import Blackhole
from tests.e2e.kube import apply, namespace, wait_for
from tests.e2e.operator_env import (
    cluster_manifest,
    delete_clusters,
    install_crd,
    operator,
    wait_ready,
)

pytestmark = pytest.mark.e2e

PATTERN = "shoal-lease"
LEASE = "shoal"
NAME = "chat"


@pytest.fixture
def ns(testbed: Testbed) -> Iterator[str]:
    install_crd(testbed)
    with namespace(testbed, PATTERN) as name:
        yield name


def _holder(bed: Testbed, ns: str) -> tuple[str, int]:
    """The Lease's holder ("" for none) and transitions; ("", 0) before it is made."""
    found = bed.kubectl("get", "lease", LEASE, "-n", ns, "-o", "json", check=False)
    spec = json.loads(found).get("spec", {}) if found else {}
    return spec.get("holderIdentity", ""), spec.get("leaseTransitions", 0)


def _renewed(bed: Testbed, ns: str) -> str:
    return bed.kubectl("get", "lease", LEASE, "-n", ns, "-o", "jsonpath={.spec.renewTime}")


def _created_events(bed: Testbed, ns: str) -> list[str]:
    """The ReplicaCreated Events' messages, once per count."""
    listed = json.loads(
        bed.kubectl(
            "get", "events", "-n", ns, "--field-selector", "reason=ReplicaCreated", "-o", "json"
        )
    )
    return sorted(e["message"] for e in listed["items"] for _ in range(e.get("count") or 1))


def _leading(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "shoal_operator_leading":
                return float(sample.value)
    raise AssertionError(f"no shoal_operator_leading in {text[:500]}")


def _operator(bed: Testbed, ns: str, log: Path, ports: Sequence[int]) -> LocalProcess:
    liveness, metrics = ports
    return operator(
        bed,
        log,
        namespaces=[ns],
        extra=[
            f"--lease={ns}/{LEASE}",
            f"--liveness=http://127.0.0.1:{liveness}/healthz",
            f"--metrics-port={metrics}",
        ],
    )


def test_two_operators_under_one_lease_act_once_and_a_standby_takes_over_a_killed_one(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    live_a, metrics_a, live_b, metrics_b = free_ports(4)
    with _operator(testbed, ns, tmp_path / "a.log", (live_a, metrics_a)) as first:
        wait_for(lambda: _holder(testbed, ns)[0], what="the first operator holds the Lease")
        first_id = _holder(testbed, ns)[0]
        standby_log = tmp_path / "b.log"
        with _operator(testbed, ns, standby_log, (live_b, metrics_b)) as second:
            try:
                wait_for(
                    lambda: "waiting to take it over" in standby_log.read_text(),
                    what="the second operator standing by",
                )
                # A standby is alive (kubelet must not restart it) and says so.
                answer = httpx.get(f"http://127.0.0.1:{live_b}/healthz", timeout=5)
                assert answer.status_code == 200 and first_id in answer.text, answer.text
                assert (_leading(metrics_a), _leading(metrics_b)) == (1, 0)
                # A standby stopped while it waits exits at once, and cleanly.
                with _operator(testbed, ns, tmp_path / "c.log", free_ports(2)) as third:
                    wait_for(
                        lambda: "waiting to take it over" in (tmp_path / "c.log").read_text(),
                        what="a third operator standing by",
                    )
                    assert third.stop() == 0

                apply(testbed, ns, cluster_manifest(NAME, replicas=2, tensor=2))
                wait_ready(testbed, ns, NAME, 2)
                assert _created_events(testbed, ns) == [
                    "creating replica 0",
                    "creating replica 1",
                ]

                first.kill()  # no release: the standby waits out the lease
                testbed.kubectl("scale", f"vlc/{NAME}", "-n", ns, "--replicas=3")
                wait_ready(testbed, ns, NAME, 3, timeout=120)
                holder, transitions = _holder(testbed, ns)
                assert holder not in ("", first_id) and transitions == 1
                assert _leading(metrics_b) == 1
                # kopf's own liveness endpoint now answers on the stand-in's address.
                answer = httpx.get(f"http://127.0.0.1:{live_b}/healthz", timeout=5)
                assert answer.status_code == 200 and "waiting" not in answer.text, answer.text
                assert _created_events(testbed, ns) == [
                    "creating replica 0",
                    "creating replica 1",
                    "creating replica 2",
                ]
            finally:
                delete_clusters(testbed, ns)
            assert second.stop() == 0
    # Stopped, it released the Lease: a successor need not wait it out.
    assert _holder(testbed, ns) == ("", 1)


def test_an_operator_whose_lease_another_takes_stops_at_once(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    log = tmp_path / "operator.log"
    liveness, metrics = free_ports(2)
    with _operator(testbed, ns, log, (liveness, metrics)) as acting:
        wait_for(lambda: _holder(testbed, ns)[0], what="the operator holds the Lease")
        # Another operator's write, as after a partition it could not see.
        taken = {"spec": {"holderIdentity": "elsewhere", "leaseDurationSeconds": 15}}
        testbed.kubectl("patch", "lease", LEASE, "-n", ns, "--type=merge", "-p", json.dumps(taken))
        assert acting.wait_exit(timeout=30) == 1
    assert "lost: elsewhere holds it: stopped so that one operator acts at a time" in (
        log.read_text()
    ), log.read_text()[-2000:]


def test_a_stopped_operator_releases_the_lease_that_others_relabelled(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    """`helm upgrade` writes the Lease's labels (the chart's version among
    them) as it replaces the operator's pod: a release that carried the
    version of the operator's own last write was refused, and the next
    operator waited out the 15 s lease."""
    with _operator(testbed, ns, tmp_path / "operator.log", free_ports(2)) as acting:
        wait_for(lambda: _holder(testbed, ns)[0], what="the operator holds the Lease")
        # Just after a renewal, so that the next is 2 s away.
        renewed = _renewed(testbed, ns)
        wait_for(lambda: _renewed(testbed, ns) != renewed, what="a renewal", interval=0.05)
        testbed.kubectl("label", "lease", LEASE, "-n", ns, "upgraded=yes")
        assert acting.stop() == 0
    assert _holder(testbed, ns)[0] == "", (tmp_path / "operator.log").read_text()[-2000:]


def _through(bed: Testbed, port: int, path: Path) -> Path:
    """The admin kubeconfig, its API server reached through 127.0.0.1:port."""
    config = yaml.safe_load(bed.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


def _operator_through(
    bed: Testbed, ns: str, port: int, tmp: Path, log: Path, ports: Sequence[int]
) -> LocalProcess:
    """An operator under the Lease whose API server is reached through 127.0.0.1:port."""
    liveness, metrics = ports
    return start_operator(
        kubeconfig=_through(bed, port, tmp / "kubeconfig"),
        namespaces=[ns],
        log=log,
        args=[
            f"--lease={ns}/{LEASE}",
            f"--liveness=http://127.0.0.1:{liveness}/healthz",
            f"--metrics-port={metrics}",
        ],
    )


def test_an_operator_whose_api_server_stops_answering_stops_before_a_standby_may_take_over(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    """Its connections to the API server hang (a blackholed route, a control
    plane half there): it cannot renew, and each request would wait out its
    own timeout (60 s). A standby that still reaches the API server takes the
    Lease once it has gone unrenewed for 15 s, so the holder must have
    stopped by then: each renewal is cut off at the renew deadline (10 s)."""
    assert testbed.state is not None
    log = tmp_path / "holder.log"
    liveness, metrics = free_ports(2)
    with Blackhole(("127.0.0.1", testbed.state.apiserver_port)) as route:
        holder = _operator_through(testbed, ns, route.port, tmp_path, log, (liveness, metrics))
        with holder:
            wait_for(lambda: _holder(testbed, ns)[0], what="the operator holds the Lease")
            first_id = _holder(testbed, ns)[0]
            standby_log = tmp_path / "standby.log"
            with _operator(testbed, ns, standby_log, free_ports(2)) as standby:
                wait_for(
                    lambda: "waiting to take it over" in standby_log.read_text(),
                    what="the standby waiting",
                )
                route.cut()
                stopped: list[bool] = []

                def taken() -> str | None:
                    stopped.append(not holder.alive())
                    held = _holder(testbed, ns)[0]
                    return held if held not in ("", first_id) else None

                wait_for(taken, what="the standby holding the Lease", timeout=90, interval=0.2)
                # Stopped before the standby took over, not after.
                assert stopped[-1], log.read_text()[-2000:]
                assert holder.wait_exit(timeout=1) == 1
                assert standby.alive()
    assert "within the renew deadline" in log.read_text(), log.read_text()[-2000:]


def test_an_operator_started_while_the_api_server_is_away_waits_for_it_alive(
    testbed: Testbed, ns: str, tmp_path: Path
) -> None:
    """kubelet restarts an operator that lost its Lease at once, and the
    control plane may still be away (an upgrade, a failover). One that exits
    when the API server refuses it is restarted with kubelet's growing
    back-off (10 s, 20 s, 40 s... up to 5 min), so it came back long after
    the control plane did. It waits instead, answering its liveness probe,
    and leads once the API server answers."""
    assert testbed.state is not None
    log = tmp_path / "operator.log"
    route, liveness, metrics = free_ports(3)
    waiting = _operator_through(testbed, ns, route, tmp_path, log, (liveness, metrics))
    with waiting:
        wait_for(
            lambda: "Kubernetes API" in log.read_text(),
            what="the operator refused by the route",
            process=waiting,
        )
        answer = wait_for(
            lambda: _alive(liveness), what="the waiting operator's liveness answer", process=waiting
        )
        assert "Kubernetes API" in answer, answer
        assert waiting.alive(), log.read_text()[-2000:]
        with Blackhole(("127.0.0.1", testbed.state.apiserver_port), port=route):
            wait_for(lambda: _holder(testbed, ns)[0], what="the operator holding the Lease")
            assert _leading(metrics) == 1
            assert waiting.stop() == 0


def _alive(port: int) -> str | None:
    """The liveness endpoint's answer, once it gives 200."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except httpx.HTTPError:
        return None
    return answer.text if answer.status_code == 200 else None


def test_two_candidates_for_a_free_lease_cannot_both_take_it(testbed: Testbed, ns: str) -> None:
    """Each write carries the resourceVersion it read: the API server refuses
    the second."""

    async def race() -> list[bool]:
        kube = KubeApi(kubeconfig=str(testbed.kubeconfig))
        try:
            meta = {"name": LEASE, "namespace": ns}
            await kube.create({"apiVersion": API_VERSION, "kind": KIND, "metadata": meta})
            # Both read the free Lease before either writes.
            lease = await kube.get(API_VERSION, KIND, ns, LEASE)
            assert lease is not None
            locks = [LeaseLock(kube, ns, LEASE, identity=who) for who in ("first", "second")]
            return [await lock.write_claim(lease) for lock in locks]
        finally:
            await kube.close()

    assert asyncio.run(race()) == [True, False]
    assert _holder(testbed, ns) == ("first", 1)


def test_an_operator_stopped_as_it_takes_the_lease_leaves_it_free(
    testbed: Testbed, ns: str
) -> None:
    """A stop (SIGTERM: a rollout, a drain) that comes as the Lease is taken
    wins, and the Lease taken meanwhile is released: kopf does not start, and
    a successor need not wait out 15 s."""

    async def stopped_as_taken() -> bool:
        kube = KubeApi(kubeconfig=str(testbed.kubeconfig))
        try:
            lock = LeaseLock(kube, ns, LEASE, identity="stopping")
            await lock.acquire()
            stop = asyncio.Event()
            stop.set()
            return await wait_to_lead(lock, stop)
        finally:
            await kube.close()

    assert asyncio.run(stopped_as_taken()) is False
    assert _holder(testbed, ns) == ("", 0)
