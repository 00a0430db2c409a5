#!/usr/bin/env bash
# Profiles every run of one driver, system-wide, until SIGINT/SIGTERM (or SECONDS): per run, its
# parent's fork to its exec, its exec to its exit, its exit to its reaping, and how long it and
# its children waited for a CPU and ran. Then one line of means per parent (kubelet's "kube",
# flexd's "flexd-spawner"). Root, bpftrace. bench/pod-startup.sh runs it with PROFILE=1.
#
# Usage: bench/profile/driver-runs.sh COMM [SECONDS]     COMM: the driver's executable name
# (started with `&` by a script, stop it with SIGTERM: such a job ignores SIGINT)
set -euo pipefail
comm=${1:?usage: $0 COMM [SECONDS]}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
# Every fork on the machine is a map entry until that process is freed: room for a burst.
BPFTRACE_MAP_KEYS_MAX=131072 bpftrace "$(dirname "$0")/driver-runs.bt" "$comm" >"$raw" 2>&1 &
tracer=$!
trap 'kill -INT $tracer 2>/dev/null || true' INT TERM
# READY=FILE: made once the probes are attached, for a caller that starts the work after.
while ! grep -q '^Attaching' "$raw" && kill -0 $tracer 2>/dev/null; do sleep 0.2; done
[ -z "${READY:-}" ] || : >"$READY"
if [ -n "${2:-}" ]; then (sleep "$2" && kill -INT $tracer 2>/dev/null) & fi
wait $tracer || wait $tracer || true
grep -m1 '^WARNING' "$raw" >&2 || true
awk '$1 == "EXEC" { exec_t[$2] = $3; fork_t[$2] = $4; parent[$2] = $5 }
  $1 == "EXIT" { exit_t[$2] = $3; waited[$2] = $4; ran[$2] = $5; procs[$2] = $6 }
  $1 == "REAP" { reap_t[$2] = $3 }
  END {
    for (p in exit_t) if ((p in exec_t) && fork_t[p] > 0) {
      k = parent[p]; n[k]++
      fe[k] += exec_t[p] - fork_t[p]; ee[k] += exit_t[p] - exec_t[p]; w[k] += waited[p]; r[k] += ran[p]; np[k] += procs[p]
      if (p in reap_t) { reaped[k]++; er[k] += reap_t[p] - exit_t[p] }
    }
    for (k in n) printf "driver runs by %s: %d, means: fork to exec %.1f ms, exec to exit %.1f ms, exit to reaped %s, waiting for a CPU %.1f ms, on a CPU %.1f ms, %.1f processes\n",
      k, n[k], fe[k] / n[k] / 1e6, ee[k] / n[k] / 1e6, reaped[k] ? sprintf("%.1f ms", er[k] / reaped[k] / 1e6) : "not seen",
      w[k] / n[k] / 1e6, r[k] / n[k] / 1e6, np[k] / n[k]
  }' "$raw"
