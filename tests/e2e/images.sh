#!/usr/bin/env bash
# tests/e2e/images.sh: flexd's images built from deploy/Dockerfile with buildah, as an operator
# builds them (docs/operator-guide.md#build-the-image), into buildah's local storage:
#   localhost/flexd:<version>            the Dockerfile's flexd target (also tagged :e2e)
#   localhost/flexd-installer:e2e        its installer target, with the e2e's hostdir driver as
#                                        e2e/late (the installer scenario's driver)
# No registry is reachable here, so the Dockerfile's two bases come from Debian's packages, by
# its build arguments: BASE_IMAGE a minbase bookworm made with mmdebstrap (what
# debian:bookworm-slim is), RUST_IMAGE the same with gcc, and the toolchain this machine builds
# with mounted where rust:1-bookworm has its own. Each base is made once per machine.
# Prints the flexd image's name. Needs root, buildah, mmdebstrap.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log() { echo "[images $(date +%T)] $*" >&2; }

BASE_IMAGE=localhost/flexd-base:bookworm-slim
RUST_IMAGE=localhost/flexd-rust:bookworm
version=$(cd "$repo" && cargo metadata --format-version 1 --no-deps --locked |
  jq -r '.packages[] | select(.name == "flexd") | .version')
commit=$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
FLEXD_IMAGE=localhost/flexd:$version

# debian:bookworm-slim's own shape, from debuerreotype, which makes it: /usr merged by the
# bootstrap itself (not by the usrmerge package, which would bring perl, 55 MB), no docs, man
# pages or translations (dpkg's path-excludes), and apt told to keep no packages or caches
# after an install (its docker-clean; the bootstrap's own caches, which mmdebstrap would
# remove, go by hand then). Without them the flexd image is twice an operator's, which every
# node of the e2e imports and `down` deletes again.
slim_dpkg=('path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/groff/*' 'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/linda/*' 'path-exclude=/usr/share/lintian/overrides/*'
  'path-exclude=/usr/share/locale/*' 'path-exclude=/usr/share/man/*')
docker_clean='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";'

# base NAME PACKAGES ENV...: an image of Debian bookworm (minbase, with PACKAGES), once.
base() {
  local name=$1 packages=$2; shift 2
  buildah inspect --type image "$name" >/dev/null 2>&1 && return 0
  log "base $name (mmdebstrap bookworm${packages:+ with $packages})"
  local tar container env opt dpkgopts=() conf
  tar=$(mktemp --suffix=.tar)
  conf=$(mktemp -d)
  mkdir -p "$conf/etc/apt/apt.conf.d"
  printf '%s\n' "$docker_clean" >"$conf/etc/apt/apt.conf.d/docker-clean"
  for opt in "${slim_dpkg[@]}"; do dpkgopts+=(--dpkgopt="$opt"); done
  # The CAs this machine adds (a proxy's, say) go in too, where the base has ca-certificates:
  # cargo in the build reaches crates.io the way this machine does.
  # shellcheck disable=SC2016 # the hooks are mmdebstrap's scripts: it gives them the root as $1
  mmdebstrap --quiet --variant=minbase ${packages:+--include="$packages"} \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${dpkgopts[@]}" \
    --customize-hook="sync-in $conf /" \
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin' \
    --customize-hook='[ -x "$1/usr/sbin/update-ca-certificates" ] || exit 0; for ca in /usr/local/share/ca-certificates/*.crt; do [ ! -e "$ca" ] || cp "$ca" "$1/usr/local/share/ca-certificates/"; done; chroot "$1" update-ca-certificates >/dev/null' \
    --format=tar bookworm "$tar"
  rm -rf "$conf"
  container=$(buildah from scratch)
  buildah add --quiet "$container" "$tar" / >/dev/null
  rm -f "$tar"
  for env in "$@"; do buildah config --env "$env" "$container"; done
  buildah config --cmd /bin/bash "$container"
  buildah commit --quiet "$container" "$name" >/dev/null
  buildah rm "$container" >/dev/null
}

base "$BASE_IMAGE" ""
base "$RUST_IMAGE" gcc,libc6-dev,ca-certificates \
  PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  CARGO_HOME=/usr/local/cargo

sysroot=$(rustc --print sysroot)
bud() {
  (cd "$repo" && buildah bud --quiet --layers -f deploy/Dockerfile \
    --build-arg RUST_IMAGE="$RUST_IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg COMMIT="$commit" --volume "$sysroot:/usr/local/rust:ro" "$@" . >/dev/null)
}
log "build: $FLEXD_IMAGE (deploy/Dockerfile, target flexd)"
bud --target flexd -t "$FLEXD_IMAGE" -t localhost/flexd:e2e
log "build: localhost/flexd-installer:e2e (deploy/Dockerfile, target installer)"
bud --target installer --build-arg DRIVER=e2e/late --build-arg DRIVER_SRC=tests/e2e/drivers/hostdir \
  -t localhost/flexd-installer:e2e
# The stages' intermediate images (a few hundred MB a build) would pile up run after run; the
# cache mounts keep what makes the next build quick.
buildah rmi --prune >/dev/null 2>&1 || true
echo "$FLEXD_IMAGE"
