#!/usr/bin/env bash
# shoal beside the peer routers (issue 25), for a quiet machine: every figure
# in docs/benchmarks.md's peer tables comes from this script's bench-results/.
#
# - A sweep light -> overload on shared-prefix with KV pressure (3,072 KV
#   blocks per engine: 49k tokens, less than the tenants' system prompts and
#   histories, which fit the fleet's 197k), on long-tail and on random; every
#   point over 3 seeds (workload, arrivals, simulators); shoal's round-robin,
#   prefix and cache-aware beside vllm-router's and smg's cache_aware and
#   power_of_two, each on 4 fresh simulated H100s at time scale 0.25.
# - The same shared-prefix point with 1, 2 and 3 router replicas of each kind.
#
# Extra arguments go to every `shoal bench compare` (say --duration 10 for a
# shorter run). Environment: SEEDS (default 0,1,2), OUT (bench-results/peers).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${OUT:-bench-results/peers}
SEEDS=${SEEDS:-0,1,2}
POLICIES=${POLICIES:-round-robin,prefix,cache-aware}
PEERS=${PEERS:-vllm-router,smg}
KV_BLOCKS=${KV_BLOCKS:-3072}
mkdir -p "$OUT"

compare() {
  local name=$1
  shift
  echo "== $name: shoal bench compare $*" >&2
  "$BIN/shoal" bench compare --replicas 4 --policies "$POLICIES" --peers "$PEERS" \
    --seeds "$SEEDS" --save "$OUT/$name.json" --plot "$OUT/$name.png" "$@" \
    | tee "$OUT/$name.txt"
}

compare shared-prefix-kv --workload shared-prefix --kv-blocks "$KV_BLOCKS" \
  --sweep --rates 15,30,45,60,90 "${@}"
compare long-tail --workload long-tail --sweep --rates 20,40,60,80 "${@}"
compare random --workload random --sweep --rates 20,40,60,80 "${@}"
for k in 1 2 3; do
  POLICIES=cache-aware compare "routers-$k" --workload shared-prefix --kv-blocks "$KV_BLOCKS" \
    --rate 45 --router-replicas "$k" "${@}"
done
