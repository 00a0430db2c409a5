#!/usr/bin/env bash
# Quick start: from a fresh checkout to a real persistent volume mounted through flexd, in one
# command. Builds flexd, installs its builtin `loop` driver into a scratch plugin dir, mounts a
# file-backed volume (sparse image + loop device + ext4), writes to it, unmounts, mounts it
# again and shows the data is still there, then cleans everything up.
#
#   examples/quickstart.sh                          # as root; builds target/release/flexd first
#   FLEXD=target/debug/flexd examples/quickstart.sh # an already built flexd
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "quickstart: run as root (it sets up a loop device and mounts a filesystem)" >&2
  exit 1
fi
if [ -z "${FLEXD:-}" ]; then
  cargo build --release -p flexd
  FLEXD=target/release/flexd
fi

work=$(mktemp -d /tmp/flexd-quickstart.XXXXXX)
plugins=$work/plugins
state=$work/state
target=$work/volume
options="{\"imageDir\":\"$work/images\",\"size\":\"256Mi\"}"

flexd() { "$FLEXD" --plugin-dir "$plugins" "$@"; }
volume() { flexd volume --state-dir "$state" "$@"; }
step() { printf '\n== %s\n' "$*"; }
cleanup() {
  volume unmount --target "$target" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

step "install flexd's builtin loop driver (flexd/loop) into $plugins"
flexd install --builtin loop --image-dir "$work/images"
flexd drivers

step "mount a 256Mi volume on $target: sparse image, loop device, ext4"
volume mount --driver flexd/loop --volume-name demo --options "$options" --target "$target"
volume list
df -h "$target"
echo "written through flexd at $(date)" >"$target/hello.txt"

step "unmount: the loop device is released, the image (the data) stays"
volume unmount --target "$target"

step "mount it again: the filesystem is reused, never reformatted"
volume mount --driver flexd/loop --volume-name demo --options "$options" --target "$target"
echo "contents: $(cat "$target/hello.txt")"
grep -q "written through flexd" "$target/hello.txt"

step "check the driver against the protocol"
flexd check --driver flexd/loop --options "$options"

step "unmount and clean up"
volume unmount --target "$target"
echo "quick start done: the data survived an unmount and a remount"
