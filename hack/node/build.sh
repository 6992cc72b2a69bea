#!/usr/bin/env bash
# Build the real node's container runtime (containerd 2.x, its runc shim and
# ctr) and its NetworkPolicy enforcer (kube-router's firewall) from Go modules,
# and install what the node takes from Debian (runc, the CNI plugins, iptables,
# ipset, conntrack). Debian bookworm's containerd is 1.6; the node runs
# containerd 2.x, which only the module proxy has.
#
# Binaries land in ~/.cache/shoal/node/<hash of the pin and this script>/bin and
# are linked into .testbed/node-bin (GOMODCACHE/GOCACHE shared with
# hack/testbed/build.sh in ~/.cache/shoal/go).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../testbed/versions.env
source "$repo/hack/testbed/versions.env"

cache_root="${SHOAL_CACHE:-$HOME/.cache/shoal}"
export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$cache_root/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$cache_root/go/build}"
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

log() { printf '[node-build %s] %s\n' "$(date +%T)" "$*" >&2; }

# Debian parts: runc, CNI plugins (bridge, host-local, loopback, portmap),
# iptables for kube-proxy and kube-router, ipset for kube-router, conntrack,
# gcc for the pause binary, buildah for the pause image. apt only when one is
# missing.
debs=(runc containernetworking-plugins iptables ipset conntrack gcc libc6-dev buildah)
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

key="$( { echo "$CONTAINERD_VERSION $KUBERNETES_VERSION $KUBE_ROUTER_VERSION"; cat "$here/build.sh"; } | sha256sum | cut -c1-16)"
out="$cache_root/node/$key"
bin="$out/bin"
link="$repo/.testbed/node-bin"
link_bin() { mkdir -p "$repo/.testbed"; ln -sfn "$bin" "$link"; }

mkdir -p "$cache_root/node"
exec 9>"$cache_root/node/.lock"
flock 9
if [[ -f "$out/.complete" ]]; then
  log "cached: $bin"
  link_bin
  exit 0
fi

mkdir -p "$bin" "$GOMODCACHE" "$GOCACHE"
log "building containerd $CONTAINERD_VERSION"
# No btrfs/devmapper/zfs snapshotters (cgo); the node uses overlayfs.
GOBIN="$bin" go install -trimpath -tags no_btrfs,no_devmapper,no_zfs \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"

# NetworkPolicy on the node: kube-router's firewall (iptables and ipsets).
# kube-network-policies, which kind runs, needs nftables' queue expression,
# which this kernel lacks.
log "building kube-router $KUBE_ROUTER_VERSION"
GOBIN="$bin" go install -trimpath -ldflags "-s -w" \
  "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"

# The pod sandbox ("pause") image: kubernetes' own pause.c from the module the
# testbed builds, static, in an image of its own (containerd's default,
# registry.k8s.io/pause, cannot be pulled here).
log "building the pause image from k8s.io/kubernetes $KUBERNETES_VERSION"
kube_dir="$(cd "$out" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
gcc -Os -static -DVERSION="shoal-$KUBERNETES_VERSION" -o "$bin/pause" "$kube_dir/build/pause/linux/pause.c"
strip "$bin/pause"
pause_image="localhost/shoal-pause:$KUBERNETES_VERSION"
ctr_id="$(buildah from scratch)"
buildah copy "$ctr_id" "$bin/pause" /pause >/dev/null
buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr_id"
buildah commit --quiet --rm "$ctr_id" "$pause_image" >/dev/null
rm -f "$out/pause.tar"
buildah push --quiet "$pause_image" "docker-archive:$out/pause.tar:$pause_image"
echo "$pause_image" > "$out/pause.name"

touch "$out/.complete"
link_bin
log "done: $bin"
ls -la "$bin" >&2
