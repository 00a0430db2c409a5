#!/usr/bin/env bash
# The CSI node path of a real flexd serve against its driver run directly, measured in one run:
# publish+unpublish cycles of the tmpfs example, then CONCURRENT publishes at once of a driver
# whose mount takes DELAY s. The state dir is on disk and on tmpfs (/dev/shm), once each. Root.
#
# "On disk" is a fresh journaled ext4 on a loop device, as mkfs.ext4 makes it for a node's
# /var/lib: this machine's own root is ext4 *without* a journal, where creating a file scans past
# every inode deleted in the last minutes (ext4's recently_deleted), so each round of publishes
# (a new record file and target directory each, removed by unpublish) made the next one slower.
# DISK=/some/dir measures that directory's filesystem instead.
# ROUNDS alternate which side runs first: 6 gives three of each order, as a figure needs.
# Usage: bench/csi.sh [CYCLES=100] [ROUNDS=6] [CONCURRENT=256] [DELAY=0.2]
set -euo pipefail
cd "$(dirname "$0")/.."
args=("${1:-100}" "${2:-6}" "${3:-256}" "${4:-0.2}")
cargo bench -q -p flexd --bench csi --no-run
disk=${DISK:-}
if [ -z "$disk" ]; then
  work=$(mktemp -d /var/tmp/flexd-csi-bench.XXXXXX)
  cleanup() {
    umount "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
  }
  trap cleanup EXIT
  truncate -s 1G "$work/ext4.img"
  mkfs.ext4 -q "$work/ext4.img"
  mkdir "$work/mnt"
  mount -o loop "$work/ext4.img" "$work/mnt"
  disk=$work/mnt
fi
for dir in "$disk" /dev/shm; do
  what=$(stat -f -c %T "$dir")
  [ -z "${DISK:-}" ] && [ "$dir" = "$disk" ] && what="a fresh journaled ext4 on a loop device"
  echo "== state dir on $what ($dir)"
  TMPDIR=$dir cargo bench -q -p flexd --bench csi -- "${args[@]}"
done
