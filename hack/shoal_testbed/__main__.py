"""`python -m shoal_testbed up|down|status` (what `make testbed-up/down` run)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from shoal_testbed import nodehost, prometheus
from shoal_testbed.cluster import DEFAULT_DIR, Testbed, bin_dir

# Where `up` runs Prometheus (hack/shoal_testbed/prometheus.py) in the state directory.
MONITORING = "monitoring"


def main() -> int:
    parser = argparse.ArgumentParser(prog="shoal_testbed", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    running = Testbed.attach(args.dir)
    if args.command == "up":
        if running is not None:
            print(f"testbed already running: export KUBECONFIG={running.kubeconfig}")
            return 0
        # The real node (docs/real-node.md) unless SHOAL_TESTBED_NODE=0.
        bed = Testbed(args.dir, real_node=nodehost.wanted_by_default())
        bed.down()  # clear what a crashed run left
        state = bed.up()
        print(f"testbed up in {state.started_seconds:.1f}s; logs in {bed.logs}")
        if prometheus.binary("prometheus").exists():
            server = prometheus.start(
                bed.dir / MONITORING, kubeconfig=bed.kubeconfig, kubectl_bin=bin_dir() / "kubectl"
            )
            print(f"Prometheus (the chart's monitors and rules, once installed): {server.url}")
        print(f"export KUBECONFIG={bed.kubeconfig}")
        print(f"export PATH={args.dir.resolve() / 'bin'}:$PATH")
        return 0
    if args.command == "down":
        prometheus.stop(args.dir.resolve() / MONITORING)
        Testbed(args.dir).down()
        print("testbed down")
        return 0
    if running is None:
        print("testbed not running")
        return 1
    assert running.state is not None
    print(f"testbed running at {running.state.server}; KUBECONFIG={running.kubeconfig}")
    print(running.kubectl("get", "nodes", "-o", "wide", "-L", "nvidia.com/gpu.product"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
