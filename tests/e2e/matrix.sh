#!/usr/bin/env bash
# The compatibility matrix: the e2e (run.sh) on each Kubernetes minor, and the table of
# docs/compatibility.md written from its results. As root, like run.sh.
#
#   tests/e2e/matrix.sh                 every minor pinned (tests/e2e/go.mod, kubernetes/*.mod)
#   tests/e2e/matrix.sh 1.29 1.33       those minors only; the table keeps the other rows
#   tests/e2e/matrix.sh --table 1.29    rewrite those rows from the results in MATRIX_DIR, no run
#
# Each minor runs MATRIX_SCENARIOS (default below: deployment, volumes, attach and detach across
# nodes, provisioning, Kubernetes' storage suite with its resize specs, `migrate --apply`, node
# loss) on E2E_NODES nodes (default 3), its own cluster up and down. A minor's row says each
# scenario's result, the storage suite's counts and the date; a minor whose Kubernetes did not
# build says so. The runs' reports stay in MATRIX_DIR (default /var/tmp/flexd-matrix).
#
# Exit status: 0 when every minor run passed, 1 otherwise (the table is written either way).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
doc=$repo/docs/compatibility.md
scenarios=${MATRIX_SCENARIOS:-deploy preflight static_pv inline fsgroup storage example nodes multiattach migrate_apply nodeloss}
out=${MATRIX_DIR:-/var/tmp/flexd-matrix}
export E2E_NODES=${E2E_NODES:-3}

# The patch release a minor's pins build.
pinned_version() {
  local file=$here/kubernetes/v$1.mod
  [ -f "$file" ] || file=$here/go.mod
  awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$file"
}
pinned_minors() {
  { awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod" | sed 's/^v\(1\.[0-9]*\).*/\1/'
    for f in "$here"/kubernetes/v1.*.mod; do basename "$f" .mod | sed 's/^v//'; done; } | sort -t. -k2 -n -u
}

run=yes
if [ "${1:-}" = --table ]; then run=no; shift; fi
minors=("$@")
[ ${#minors[@]} -gt 0 ] || mapfile -t minors < <(pinned_minors)
[ "$run" = no ] || [ "$(id -u)" = 0 ] || { echo "matrix.sh: the e2e needs root" >&2; exit 1; }
[ -f "$doc" ] && grep -q '^<!-- matrix:begin -->$' "$doc" ||
  { echo "matrix.sh: $doc has no <!-- matrix:begin --> marker" >&2; exit 1; }

# One flexd for every minor of the run, copied now: a FLEXD rebuilt while the matrix runs (it
# takes hours) must not change under the minors still to come.
if [ "$run" = yes ] && [ -n "${FLEXD:-}" ]; then
  mkdir -p "$out"
  cp "$FLEXD" "$out/flexd.$$" && mv -f "$out/flexd.$$" "$out/flexd" || { echo "matrix.sh: cannot copy FLEXD=$FLEXD" >&2; exit 1; }
  export FLEXD=$out/flexd
fi

status=0
for minor in "${minors[@]}"; do
  [ "$run" = yes ] || { [ -f "$out/$minor/date" ] || { echo "matrix.sh: no results for $minor in $out" >&2; exit 1; }; continue; }
  [[ $minor =~ ^1\.[0-9]+$ ]] || { echo "matrix.sh: $minor is not a minor (like 1.29)" >&2; exit 2; }
  dir=$out/$minor
  rm -rf "$dir" && mkdir -p "$dir"
  echo "matrix.sh: Kubernetes $minor: $scenarios ($E2E_NODES nodes); log in $dir/run.log" >&2
  started=$(date +%s)
  # The tools first, so a Kubernetes that does not build is told apart from a failed run.
  built=yes
  for tool in kube storage-e2e ginkgo csi-provisioner csi-resizer; do
    if ! E2E_KUBERNETES=$minor "$here/tools.sh" "$tool" >>"$dir/build.log" 2>&1; then
      built="$tool did not build ($(grep -m1 -v '^go: downloading\|^tools.sh: building' "$dir/build.log" | cut -c1-120))"
      break
    fi
  done
  if [ "$built" = yes ]; then
    E2E_KUBERNETES=$minor E2E_SCENARIOS="$scenarios" E2E_REPORT_DIR="$dir" \
      "$here/run.sh" >"$dir/run.log" 2>&1
    echo $? >"$dir/exit"
  else
    echo "$built" >"$dir/not-built"
  fi
  echo $(($(date +%s) - started)) >"$dir/seconds"
  date -u +%Y-%m-%d >"$dir/date"
  pinned_version "$minor" >"$dir/version"
  [ "$(cat "$dir/exit" 2>/dev/null)" = 0 ] || status=1
  echo "matrix.sh: Kubernetes $minor: $(tail -1 "$dir/run.log" 2>/dev/null || cat "$dir/not-built") in $(cat "$dir/seconds") s" >&2
done

# The row of a minor from its results: each scenario's state in the Ginkgo report.
row() {
  local dir=$out/$1 cells= name state storage
  for name in $scenarios; do
    if [ -f "$dir/not-built" ]; then state="–"
    else
      state=$(jq -r --arg n "$name" '[.[].SpecReports[]? | select(.LeafNodeType == "It" and .LeafNodeText == $n) | .State] | first // "not run"' \
        "$dir/scenarios.json" 2>/dev/null || echo "not run")
      case $state in passed) state=pass ;; skipped | "not run") state="–" ;; *) state="**$state**" ;; esac
    fi
    cells="$cells | $state"
  done
  # "storage loop: 38 passed, 0 failed, 249 skipped in 386 seconds" -> "loop 38 passed, 0 failed"
  storage=$(sed -n 's/^storage \([^:]*\): \(.*\), [0-9]* skipped.* in .*/\1 \2/p' "$dir/scenario-storage.summary" 2>/dev/null | paste -sd';' - | sed 's/;/; /g')
  [ ! -f "$dir/not-built" ] || storage="not built: $(cut -c1-160 "$dir/not-built")"
  echo "| $1 ($(cat "$dir/version"))$cells | ${storage:-–} | $(cat "$dir/date") |"
}

# The table: this run's rows, and the rows of minors it did not run kept as they were.
table=$(mktemp)
{
  printf '| Kubernetes'; for name in $scenarios; do printf ' | %s' "$name"; done; echo ' | storage suite | run |'
  printf '|---'; for name in $scenarios; do printf '|---'; done; echo '|---|---|'
  for minor in $(pinned_minors); do
    if [ -f "$out/$minor/date" ] && printf '%s\n' "${minors[@]}" | grep -qx "$minor"; then
      row "$minor"
    else
      kept=$(sed -n '/^<!-- matrix:begin -->$/,/^<!-- matrix:end -->$/p' "$doc" | grep "^| $minor (" || true)
      if [ -n "$kept" ]; then echo "$kept"
      else
        # Pinned, never run: said, not left out.
        printf '| %s (%s)' "$minor" "$(pinned_version "$minor")"
        for name in $scenarios; do printf ' | –'; done
        echo ' | not run yet | – |'
      fi
    fi
  done
} >"$table"
awk -v table="$table" '
  /^<!-- matrix:begin -->$/ {print; while ((getline line < table) > 0) print line; skip = 1; next}
  /^<!-- matrix:end -->$/ {skip = 0}
  !skip' "$doc" >"$doc.new" && mv "$doc.new" "$doc"
rm -f "$table"
echo "matrix.sh: the table in docs/compatibility.md is written" >&2
exit $status
