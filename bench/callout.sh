#!/usr/bin/env bash
# Call-out overhead of the library against plain spawn-and-wait, measured in one run.
# Usage: bench/callout.sh [N=1000] [ROUNDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p flexvolume-host --bench callout -- "${1:-1000}" "${2:-5}"
