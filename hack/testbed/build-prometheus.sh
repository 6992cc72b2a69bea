#!/usr/bin/env bash
# Build Prometheus and promtool from Go modules through the module proxy, for the
# testbed's monitoring (tests/e2e/test_monitoring*.py) and the chart's rule tests.
#
# Binaries land in ~/.cache/shoal/prometheus/<hash of the pins and this script>/bin
# and are linked into .testbed/prometheus/bin (build.sh's pattern). No web UI
# assets: tests use the HTTP API only (without the builtinassets tag the UI pages
# answer 500, the API is unaffected). Beside them, crds/ holds prometheus-operator's
# ServiceMonitor, PodMonitor and PrometheusRule CRDs, from its Go module, so the
# testbed's API server validates the chart's monitors against the real schemas.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PROMETHEUS_VERSION="$(sed -n 's/^PROMETHEUS_VERSION=//p' "$here/versions.env")"
OPERATOR_VERSION="$(sed -n 's/^PROMETHEUS_OPERATOR_VERSION=//p' "$here/versions.env")"
[[ -n "$PROMETHEUS_VERSION" && -n "$OPERATOR_VERSION" ]] \
  || { echo "PROMETHEUS_VERSION or PROMETHEUS_OPERATOR_VERSION missing in versions.env" >&2; exit 1; }

cache_root="${SHOAL_CACHE:-$HOME/.cache/shoal}"
export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$cache_root/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$cache_root/go/build}"
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

key="$( { echo "$PROMETHEUS_VERSION $OPERATOR_VERSION"; cat "$here/build-prometheus.sh"; } | sha256sum | cut -c1-16)"
out="$cache_root/prometheus/$key"
bin="$out/bin"
link="$repo/.testbed/prometheus"

log() { printf '[prometheus-build %s] %s\n' "$(date +%T)" "$*" >&2; }

link_bin() {
  mkdir -p "$repo/.testbed"
  ln -sfn "$out" "$link"
}

# One build at a time per cache (CI starts one early in the background).
mkdir -p "$cache_root/prometheus"
exec 9>"$cache_root/prometheus/.lock"
flock 9

if [[ -f "$out/.complete" ]]; then
  log "cached: $bin"
  link_bin
  exit 0
fi

mkdir -p "$bin" "$GOMODCACHE" "$GOCACHE"
# Module v0.3XX.Y is Prometheus 3.XX.Y; stamp it so `prometheus --version` and
# /api/v1/status/buildinfo say which release runs.
minor_patch="${PROMETHEUS_VERSION#v0.3}"            # 16.0
release="3.${minor_patch}"
ldflags="-s -w \
 -X github.com/prometheus/common/version.Version=$release \
 -X github.com/prometheus/common/version.Revision=$PROMETHEUS_VERSION \
 -X github.com/prometheus/common/version.Branch=release \
 -X github.com/prometheus/common/version.BuildUser=shoal \
 -X github.com/prometheus/common/version.BuildDate=19700101-00:00:00"
log "building prometheus and promtool $release ($PROMETHEUS_VERSION)"
# Only the Kubernetes service discovery (plus the ones that cannot be left out)
# is needed; the remove_all_sd tag with the kubernetes one keeps the build smaller.
GOBIN="$bin" go install -trimpath -tags "remove_all_sd,enable_kubernetes_sd" -ldflags "$ldflags" \
  "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
  "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"

log "copying prometheus-operator $OPERATOR_VERSION CRDs"
operator_dir="$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$OPERATOR_VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
mkdir -p "$out/crds"
for kind in servicemonitors podmonitors prometheusrules; do
  cp "$operator_dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$out/crds/"
done

touch "$out/.complete"
link_bin
log "done: $bin"
ls -la "$bin" >&2
