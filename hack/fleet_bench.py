"""What the fleet benches on the testbed share (hack/warmup_bench.py,
hack/autoscale_bench.py): a local operator watching the bench's namespaces,
one namespace per mode, and its cleanup."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.procs import LocalProcess, start_operator, wait_until
from shoal_testbed.cluster import REPO, Testbed

CRD = REPO / "charts/shoal/crds/vllmclusters.serving.shoal.dev.yaml"


@contextlib.contextmanager
def testbed_for(state: Path, work: Path) -> Iterator[Testbed]:
    """The testbed running in `state`, else a private one in work/testbed for
    the bench's length (stopped after, a half-started one too)."""
    bed = Testbed.attach(state)
    if bed is not None:
        yield bed
        return
    print(f"no testbed in {state}: starting a private one in {work / 'testbed'}")
    bed = Testbed(work / "testbed", owned_by_caller=True)
    try:
        bed.up()
        yield bed
    finally:
        bed.down()


class FleetBench:
    """A bench's fleets live in namespaces named `<prefix>-<mode>-<random>`."""

    def __init__(self, bed: Testbed, work: Path, *, ns_prefix: str) -> None:
        self.bed, self.work, self.ns_prefix = bed, work, ns_prefix
        self.operator: LocalProcess | None = None

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        return self.bed.kubectl(*args, input_text=input_text, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def start_operator(self) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        self.bed.wait_crd_established("vllmclusters.serving.shoal.dev")
        self.operator = start_operator(
            kubeconfig=self.bed.kubeconfig,
            namespaces=[f"{self.ns_prefix}-*"],
            log=self.work / "operator.log",
        )

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()

    def namespace(self, mode: str) -> str:
        name = f"{self.ns_prefix}-{mode}-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        wait_until(
            lambda: self.kubectl("get", "sa", "default", "-n", name, check=False),
            what=f"the default ServiceAccount in {name}",
        )
        return name

    def delete(self, ns: str, *, timeout: str = "90s") -> None:
        """The clusters while the operator runs (its finalizer), then the namespace."""
        self.kubectl(
            "delete", "vllmclusters", "--all", "-n", ns, f"--timeout={timeout}", check=False
        )
        self.kubectl("delete", "namespace", ns, "--wait=false", check=False)
