#!/usr/bin/env bash
# The builtin loop driver: mount+unmount cycles of one volume through flexd, with the driver
# installed as the standalone flexd-loop (what `install --builtin loop` picks when it is beside
# flexd) against flexd itself as a multi-call driver (the fallback), both measured in this run.
# flexd pins a copy of the driver for each mounted volume, so the executable's size matters.
# Usage (root): bench/loop.sh [CYCLES=10] [PROFILE=release]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-10}
profile=${2:-release}
[ "$(id -u)" = 0 ] || { echo "needs root (loop devices, mounts)"; exit 1; }

if [ "$profile" = release ]; then cargo build -q --release -p flexd; else cargo build -q -p flexd; fi
bin=target/$profile
work=$(mktemp -d /tmp/flexd-bench-loop.XXXXXX)
cleanup() {
  for v in standalone multicall; do
    "$bin/flexd" --plugin-dir "$work/$v/exec" volume --state-dir "$work/$v/state" \
      unmount --target "$work/$v/target" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/alone"
cp "$bin/flexd" "$work/alone/flexd"   # flexd without flexd-loop beside it
options="{\"imageDir\":\"$work/images\",\"size\":\"64Mi\"}"

# Prints the mean milliseconds of one mount+unmount cycle for variant $1 installed by flexd $2.
measure() {
  local v=$1 installer=$2 dir=$work/$1
  "$installer" --plugin-dir "$dir/exec" install --builtin loop --image-dir "$work/images" >/dev/null 2>&1
  local cycle=("$bin/flexd" --plugin-dir "$dir/exec" volume --state-dir "$dir/state")
  # The first mount formats; it is not measured.
  "${cycle[@]}" mount --driver flexd/loop --volume-name "$v" --options "$options" --target "$dir/target" >/dev/null
  "${cycle[@]}" unmount --target "$dir/target" >/dev/null
  local start end
  start=$(date +%s%N)
  for _ in $(seq "$cycles"); do
    "${cycle[@]}" mount --driver flexd/loop --volume-name "$v" --options "$options" --target "$dir/target" >/dev/null
    "${cycle[@]}" unmount --target "$dir/target" >/dev/null
  done
  end=$(date +%s%N)
  echo $(( (end - start) / cycles / 1000000 ))
}

standalone=$(measure standalone "$bin/flexd")
multicall=$(measure multicall "$work/alone/flexd")
size() { stat -c %s "$1"; }
echo "profile $profile, $cycles cycles of mount+unmount each"
echo "standalone flexd-loop ($(size "$bin/flexd-loop") bytes): ${standalone} ms per cycle"
echo "flexd multi-call      ($(size "$bin/flexd") bytes): ${multicall} ms per cycle"
awk -v a="$multicall" -v b="$standalone" 'BEGIN { printf "multi-call / standalone: %.2fx\n", a / (b > 0 ? b : 1) }'
