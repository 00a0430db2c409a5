#!/usr/bin/env bash
# The CSI node path of a real flexd serve against its driver run directly, measured in one run:
# publish+unpublish cycles of the tmpfs example, then CONCURRENT publishes at once of a driver
# whose mount takes DELAY s. Once with the state dir on disk, once on tmpfs (/dev/shm). Root.
# Usage: bench/csi.sh [CYCLES=100] [ROUNDS=5] [CONCURRENT=256] [DELAY=0.2]
set -euo pipefail
cd "$(dirname "$0")/.."
args=("${1:-100}" "${2:-5}" "${3:-256}" "${4:-0.2}")
cargo bench -q -p flexd --bench csi --no-run
for dir in "${TMPDIR:-/var/tmp}" /dev/shm; do
  echo "== state dir on $(stat -f -c %T "$dir") ($dir)"
  TMPDIR=$dir cargo bench -q -p flexd --bench csi -- "${args[@]}"
done
