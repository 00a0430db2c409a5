#!/usr/bin/env bash
# Discovery benchmarks (latency, storm, scale) against the real flexd watch, each against a
# baseline measured in the same run. Usage: bench/discovery.sh [latency|storm|scale]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "the storm writer needs python3" >&2; exit 1; }
cargo bench -q -p flexd --bench discovery -- ${1:-}
