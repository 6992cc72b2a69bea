#!/usr/bin/env bash
# A local base image from Debian packages: Python 3.11 and `python3 -m venv`,
# nothing else (no registry is reachable where the testbed runs, so the public
# slim image cannot be pulled). Prints the image name.
#
# The rootfs tarball is cached in ~/.cache/shoal/image/base-<key>.tar, keyed by
# the suite, the package list and this script; podman imports it when its
# storage lacks the tag.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${SHOAL_CACHE:-$HOME/.cache/shoal}"
suite=bookworm
packages=python3,python3-venv,libstdc++6  # libstdc++: numpy's wheels (the bench extra)

log() { printf '[image-base %s] %s\n' "$(date +%T)" "$*" >&2; }

key="$( { echo "$suite $packages"; cat "$here/base.sh"; } | sha256sum | cut -c1-16)"
tarball="$cache_root/image/base-$key.tar"
image="localhost/shoal-base:$key"

mkdir -p "$cache_root/image"
exec 8>"$cache_root/image/.base.lock"
flock 8

if [[ ! -f "$tarball" ]]; then
  log "building $suite with $packages (mmdebstrap)"
  # essential: dpkg, a shell and coreutils (the Dockerfile's RUN needs them);
  # no docs, man pages or locales.
  mmdebstrap --variant=essential --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$suite" "$tarball.tmp.tar" >&2
  mv "$tarball.tmp.tar" "$tarball"
fi
if ! podman image exists "$image"; then
  log "importing $tarball as $image"
  podman import --quiet "$tarball" "$image" >/dev/null
fi
echo "$image"
