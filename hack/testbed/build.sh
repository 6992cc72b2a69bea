#!/usr/bin/env bash
# Build the testbed's control plane from Go modules through the module proxy.
#
# Binaries land in ~/.cache/shoal/testbed/<hash of pins and this script>/bin and
# are linked into .testbed/bin, so a fresh clone on the same machine reuses them.
# GOMODCACHE and GOCACHE live in ~/.cache/shoal/go for the same reason.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${SHOAL_CACHE:-$HOME/.cache/shoal}"
export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$cache_root/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$cache_root/go/build}"
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

# Keyed by the pins this script builds (not the whole versions.env, whose other
# components have build scripts and caches of their own) and by the script.
key="$( { echo "$KUBERNETES_VERSION $ETCD_VERSION $KWOK_VERSION $HELM_VERSION"; cat "$here/build.sh"; } \
  | sha256sum | cut -c1-16)"
out="$cache_root/testbed/$key"
bin="$out/bin"
link="$repo/.testbed/bin"

log() { printf '[testbed-build %s] %s\n' "$(date +%T)" "$*" >&2; }

link_bin() {
  mkdir -p "$repo/.testbed"
  ln -sfn "$bin" "$link"
}

# One build at a time per cache (CI starts one early in the background).
mkdir -p "$cache_root/testbed"
exec 9>"$cache_root/testbed/.lock"
flock 9

if [[ -f "$out/.complete" ]]; then
  log "cached: $bin"
  link_bin
  exit 0
fi

mkdir -p "$bin" "$GOMODCACHE" "$GOCACHE"
work="$out/src"
rm -rf "$work"
mkdir -p "$work/kube" "$work/etcd"

kube_minor="${KUBERNETES_VERSION#v1.}"       # 36.3
staging_version="v0.${kube_minor}"             # v0.36.3
major_minor="${KUBERNETES_VERSION%.*}"         # v1.36

# --- k8s.io/kubernetes wrapper: every staging module mapped to its published release.
log "resolving k8s.io/kubernetes $KUBERNETES_VERSION"
kube_dir="$(cd "$work/kube" && go mod init shoal.dev/testbed/kube >/dev/null 2>&1 \
  && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kube_dir/go.mod")
kube_go=$(sed -n 's/^go \(.*\)/\1/p' "$kube_dir/go.mod")
kube_godebug=$(sed -n 's/^godebug \(.*\)/\1/p' "$kube_dir/go.mod")
{
  echo "module shoal.dev/testbed/kube"
  echo "go $kube_go"
  [[ -n "$kube_godebug" ]] && echo "godebug $kube_godebug"
  echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
  echo "replace ("
  for m in $staging; do echo "  $m => $m $staging_version"; done
  echo ")"
  echo "tool ("
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    echo "  k8s.io/kubernetes/cmd/$c"
  done
  echo ")"
} > "$work/kube/go.mod"
(cd "$work/kube" && go mod tidy)

kube_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${kube_minor%%.*} \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=${kube_minor%%.*}"
# kubelet and kube-proxy: the testbed's real node (hack/node, docs/real-node.md).
log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy ($major_minor)"
(cd "$work/kube" && go build -trimpath -tags selinux,notest,grpcnotrace \
  -ldflags "$kube_ldflags" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)

# --- etcd: its server module has local replaces, so it needs a wrapper too.
log "building etcd $ETCD_VERSION"
cat > "$work/etcd/go.mod" <<MOD
module shoal.dev/testbed/etcd
go 1.26.0
require go.etcd.io/etcd/server/v3 $ETCD_VERSION
tool go.etcd.io/etcd/server/v3
MOD
(cd "$work/etcd" && go mod tidy && go build -trimpath \
  -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
  -o "$bin/etcd" go.etcd.io/etcd/server/v3)

# --- kwok and helm have no replaces: go install works.
log "building kwok $KWOK_VERSION"
GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
# kwok's stage YAMLs ship in its module; keep a copy beside the binary for reference.
log "building helm $HELM_VERSION"
# Helm's own build stamps the Kubernetes version of its client libraries; without
# it, offline `helm template` and `helm lint` assume Kubernetes 1.20.
helm_dir="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
helm_k8s_minor="$(sed -n 's#^\s*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_dir/go.mod")"
GOBIN="$bin" go install -trimpath -ldflags "-s -w \
 -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
 -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$helm_k8s_minor \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_k8s_minor" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

rm -rf "$work"
touch "$out/.complete"
link_bin
log "done: $bin"
ls -la "$bin" >&2
