#!/usr/bin/env bash
# `make image`: the project's Dockerfile built with buildah, and the
# shoal-engine-sim stand-in (NOT vLLM) on top of it.
#
#   SHOAL_IMAGE_BASE  the Dockerfile's BASE (default: a local base built from
#                     Debian packages by hack/image/base.sh; no registry here)
#   SHOAL_IMAGE       the image's name (default localhost/shoal:dev)
#
# Both images are saved as OCI archives in ~/.cache/shoal/image/<key>/, keyed by
# every file the build reads, and linked at .testbed/images (the real node
# imports them into containerd from there). A warm cache skips the build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache_root="${SHOAL_CACHE:-$HOME/.cache/shoal}"
image="${SHOAL_IMAGE:-localhost/shoal:dev}"
engine_image="${SHOAL_ENGINE_IMAGE:-localhost/shoal-engine-sim:dev}"

log() { printf '[image %s] %s\n' "$(date +%T)" "$*" >&2; }

# Debian's buildah and podman (podman: the base import and the image checks),
# mmdebstrap for the base.
missing=()
for d in buildah podman mmdebstrap; do command -v "$d" >/dev/null || missing+=("$d"); done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

base="${SHOAL_IMAGE_BASE:-$(bash "$here/base.sh")}"

cd "$repo"
inputs=$( { echo "$base $image $engine_image"
  git ls-files -co --exclude-standard -- Dockerfile pyproject.toml README.md operator hack/image \
    | grep -v '\.pyc$' | sort | xargs sha256sum; } | sha256sum | cut -c1-16)
out="$cache_root/image/$inputs"
mkdir -p "$cache_root/image" .testbed
exec 9>"$cache_root/image/.lock"
flock 9

# Every source change makes a new key of about 1 GB, so keep only this one and
# the most recently used others (another clone's testbed may link one): a full
# disk makes the real node's kubelet remove the images it runs.
keep_keys=3
prune_cache() {
  touch "$out"
  find "$cache_root/image" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
      -regex '.*/[0-9a-f]{16}' -printf '%T@ %p\n' \
    | sort -rn | tail -n +$((keep_keys + 1)) | cut -d' ' -f2- \
    | while read -r old; do log "pruning $old"; rm -rf "$old"; done
}

if [[ -f "$out/.complete" ]]; then
  log "cached: $out"
  ln -sfn "$out" .testbed/images
  prune_cache
  exit 0
fi

# The images this build replaces, removed from buildah's store once saved (each
# rebuild would otherwise leave a dangling half-gigabyte image behind).
replaced=$(podman image inspect --format '{{.Id}}' "$engine_image" "$image" 2>/dev/null || true)

# RUN steps in a chroot, not an OCI container: crun refuses to create one on a
# host whose cgroup v2 hierarchy has controllers while v1 hierarchies are also
# mounted ("cgroups in hybrid mode not supported"), as this machine's hugetlb
# can be. A build step needs no cgroup limits; the image is the same.
isolation=(--isolation chroot)
build_args=("${isolation[@]}" --network host --layers=false --build-arg "BASE=$base")
# pip inside the build trusts what the host's pip trusts (a TLS-intercepting
# proxy's CA, where there is one): mounted for the RUN only, not in the image.
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  build_args+=(--volume /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro
    --build-arg PIP_CERT=/run/host-ca.crt)
fi
log "building $image from $base"
buildah bud --quiet "${build_args[@]}" -f Dockerfile -t "$image" . >&2
log "building $engine_image"
buildah bud --quiet "${isolation[@]}" --layers=false --build-arg "SHOAL_IMAGE=$image" \
  -f hack/image/engine-sim.Dockerfile -t "$engine_image" . >&2

rm -rf "$out"
mkdir -p "$out"
podman save --quiet --format docker-archive -o "$out/shoal.tar" "$image"
podman save --quiet --format docker-archive -o "$out/shoal-engine-sim.tar" "$engine_image"
printf '%s\n' "$image" > "$out/shoal.name"
printf '%s\n' "$engine_image" > "$out/shoal-engine-sim.name"
touch "$out/.complete"
ln -sfn "$out" .testbed/images
current=$(podman image inspect --format '{{.Id}}' "$engine_image" "$image")
for id in $replaced; do
  # The engine image first: it is built on the shoal image. One still in use
  # (a container, a tag of its own) stays.
  grep -qx "$id" <<<"$current" || podman rmi "$id" >/dev/null 2>&1 || true
done
prune_cache
log "done: $out"
ls -la "$out" >&2
