#!/usr/bin/env bash
# SetUp(fsGroup) ownership pass: flexd against coreutils and against Kubernetes' sequential
# walk, on a tmpfs tree (so the disk is not measured), all measured in this run.
# Usage (root): bench/ownership.sh [DIRS=1000] [FILES_PER_DIR=1000] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=${1:-1000}
files=${2:-1000}
rounds=${3:-3}
[ "$(id -u)" = 0 ] || { echo "needs root (mounts a tmpfs, changes groups)"; exit 1; }
command -v strace >/dev/null || { echo "needs strace (apt-get install strace)"; exit 1; }

cargo build -q --release -p flexd
cargo build -q --release -p flexvolume-host --example kubernetes_ownership_walk
flexd=target/release/flexd
k8s=target/release/examples/kubernetes_ownership_walk

work=$(mktemp -d)
cleanup() { umount "$work" 2>/dev/null || true; rmdir "$work"; }
trap cleanup EXIT
mount -t tmpfs -o size=4g,nr_inodes=0 tmpfs "$work"
tree="$work/volume"
echo "building $dirs dirs x $files files on tmpfs..."
python3 - "$tree" "$dirs" "$files" <<'PY'
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(root)
for d in range(dirs):
    dp = os.path.join(root, "d%d" % d)
    os.mkdir(dp)
    for f in range(files):
        os.close(os.open(os.path.join(dp, "f%d" % f), os.O_CREAT | os.O_WRONLY, 0o644))
PY
entries=$(( dirs * files + dirs + 1 ))
echo "tree: $entries entries"

# Back to the state of a fresh volume: group 0, no group write, no setgid. Not timed.
reset() {
  chgrp -R 0 "$tree"
  chmod -R g-w,g-s "$tree"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {print b - a}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

declare -A total
run() { # name gid
  local start end
  case $1 in
    flexd) start=$(now); "$flexd" ownership apply "$tree" --fs-group "$2" >/dev/null; end=$(now) ;;
    coreutils) start=$(now)
      chgrp -R "$2" "$tree"; chmod -R g+rwX "$tree"; find "$tree" -type d -exec chmod g+s {} +
      end=$(now) ;;
    kubernetes) start=$(now); "$k8s" "$tree" "$2"; end=$(now) ;;
  esac
  elapsed "$start" "$end"
}

declare -A times
for r in $(seq 1 "$rounds"); do
  # Rotate the order so no contender always runs first (or last) in a round.
  order=(flexd coreutils kubernetes)
  for _ in $(seq 2 "$r"); do order=("${order[@]:1}" "${order[0]}"); done
  for c in "${order[@]}"; do
    reset
    t=$(run "$c" $((4000 + r)))
    times[$c]="${times[$c]:-} $t"
    printf 'round %d %-10s %8.3f s\n' "$r" "$c" "$t"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
f=$(echo "${times[flexd]}" | median)
c=$(echo "${times[coreutils]}" | median)
k=$(echo "${times[kubernetes]}" | median)

# The same tree once more, already right: time it, and count chown/chmod calls.
right_start=$(now); "$flexd" ownership apply "$tree" --fs-group $((4000 + rounds)) >/dev/null; right_end=$(now)
right=$(elapsed "$right_start" "$right_end")
strace -f -c -o "$work/strace.txt" "$flexd" ownership apply "$tree" --fs-group $((4000 + rounds)) >/dev/null
changes=$(awk '$NF ~ /^(chown|fchown|fchownat|lchown|chmod|fchmod|fchmodat|fchmodat2)$/ {n += $4} END {print n+0}' "$work/strace.txt")
stats=$(awk '$NF ~ /^(newfstatat|statx|fstat)$/ {n += $4} END {print n+0}' "$work/strace.txt")

echo
echo "median over $rounds rounds, $entries entries changing group and mode:"
printf '  flexd       %8.3f s\n  coreutils   %8.3f s  (chgrp -R, chmod -R g+rwX, find -type d chmod g+s)\n  kubernetes  %8.3f s  (sequential walk, lchown + chmod on every entry)\n' "$f" "$c" "$k"
printf '  speedup vs coreutils:  %.2fx (target >= 2)\n' "$(ratio "$c" "$f")"
printf '  speedup vs kubernetes: %.2fx (target >= 2)\n' "$(ratio "$k" "$f")"
echo "already right: $right s = $(ratio "$right" "$f") of the changing pass (target <= 0.333)"
echo "already right: $changes chown/chmod syscalls (target 0), $stats stat calls (strace -c -f)"
