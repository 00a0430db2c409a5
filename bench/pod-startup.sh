#!/usr/bin/env bash
# Pod start-up, created → Ready, with its volume through kubelet's own FlexVolume plugin against
# the same driver through flexd (CSI), in one run on one cluster: the e2e cluster of
# tests/e2e/run.sh, brought up here (as its own E2E_NAME) and removed at the end. Root.
#
# The driver is tests/e2e/drivers/hostdir (a bind mount): "fast" as it is, "slow" with its
# quirk option making mount take a second, as a network filesystem's may. Each pod has one
# inline volume of its own: an inline flexVolume for kubelet, an inline CSI volume for flexd, the
# same options. SEQUENTIAL pods one after another (the two paths alternating), then CONCURRENT
# pods at once, one path after the other. Times come from one watch on the API server: the
# pod's first appearance to its Ready condition, stamped as the watch delivers them.
#
# One line per measurement, ending with flexd's median over kubelet's (`... 1.04x`), each
# followed by where the time went: the mean of kubelet's own volume_mount operations per plugin
# (its /metrics: the whole MountVolume, the driver's run included) and of flexd's mount
# call-outs (flexd's /metrics). For the pods at once, also each path's MountVolume outside the
# driver: kubelet's volume_mount mean for the plugin minus the driver's own run (the driver
# stamps it, option timed), and flexd's over kubelet's (`... overhead ... 1.15x`), then where
# flexd's went: kubelet's CSI plugin around its NodePublishVolume call (its own
# csi_operations_seconds), flexd outside the call-out, the call-out outside the driver. The
# bench's own kubectl runs at the least CPU weight (as_remote_client in cluster.sh), as a client
# off the node would not take the node's CPU.
#
# Usage: bench/pod-startup.sh [SEQUENTIAL=20] [CONCURRENT=50]
# FLEXD=path/to/flexd uses that binary (default: cargo build --release -p flexd). PROFILE=1
# profiles every driver run of the pods at once (bench/profile/driver-runs.sh: bpftrace) and
# prints, per path, how long its runs took to start, ran, waited for a CPU and took to be reaped.
set -euo pipefail
SEQUENTIAL=${1:-20}
CONCURRENT=${2:-50}
export E2E_NAME=${E2E_NAME:-flexd-bench}
# shellcheck source=tests/e2e/run.sh
bench_dir=$(cd "$(dirname "$0")" && pwd)
. "$bench_dir/../tests/e2e/run.sh"
trap 'pkill -P $$ 2>/dev/null || true; leave_client_cgroup; down >/dev/null 2>&1 || true' EXIT
up_deployed

delete_pod() { kubectl delete pod "$1" --wait=true --timeout=120s; }

# A hostNetwork busybox pod with the volume VOLUME_YAML at /data running SCRIPT.
pod_create() { # NAME SCRIPT VOLUME_YAML
  kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $TOOLS_IMAGE
    imagePullPolicy: Never
    command: [/bin/sh, -c, '$2; echo DONE; exec sleep 3600']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
$3
EOF
}

watch_log=$D/run/pod-startup.watch
# Every pod event, stamped when the watch delivers it: "EPOCH NAME READY".
innet "$D/bin/kube" kubectl --kubeconfig="$D/kubeconfig" get pods --watch --output-watch-events \
  -o jsonpath='{.object.metadata.name} {.object.status.conditions[?(@.type=="Ready")].status}{"\n"}' |
  while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$watch_log" &
# The pods' creations from here on (50 kubectl at once) come as from off the node; the watch
# above keeps its stamps on time at full weight.
as_remote_client

bench_pod() { # NAME PATH SPEED: created, not waited for
  local volume
  case $2 in
    kubelet) volume="    flexVolume: {driver: $DRIVER, options: {volume: $1, quirk: \"$3\", timed: \"1\"}}" ;;
    flexd) volume="    csi: {driver: $CSI_NAME, volumeAttributes: {volume: $1, quirk: \"$3\", timed: \"1\"}}" ;;
  esac
  pod_create "$1" 'true' "$volume" >/dev/null
}
ready_seen() { grep -q " $1 True$" "$watch_log"; }
startup() { # NAME: seconds from its first event to its first Ready=True
  awk -v pod="$1" '$2 == pod && !first { first = $1 } $2 == pod && $3 == "True" { print $1 - first; exit }' "$watch_log"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
delete_all() { kubectl delete pods -l bench=pod-startup --wait=true --timeout=600s >/dev/null; }
label() { kubectl label pod "$1" bench=pod-startup >/dev/null; }

# Where the time goes: "SOURCE SUM COUNT" lines, kubelet's volume_mount operations per plugin
# and its NodePublishVolume calls to flexd (its /metrics), and flexd's mount
# call-outs (flexd's /metrics), cumulative.
mount_metrics() {
  innet curl -sk "https://$NODE_IP:10250/metrics" |
    awk -v csi="$CSI_NAME" '/^storage_operation_duration_seconds_(sum|count)\{/ && /operation_name="volume_mount"/ && /volume_plugin="(e2e\/hostdir|kubernetes.io\/csi:[^"]*)"/ {
        match($0, /volume_plugin="[^"]*"/); p = substr($0, RSTART + 15, RLENGTH - 16)
        if ($1 ~ /_sum\{/) s[p] += $NF; else c[p] += $NF }
      /^csi_operations_seconds_(sum|count)\{/ && index($0, "driver_name=\"" csi "\"") && /method_name="\/csi.v1.Node\/NodePublishVolume"/ {
        match($0, /Node\/[A-Za-z]*"/); p = "grpc:" substr($0, RSTART + 5, RLENGTH - 6)
        if ($1 ~ /_sum\{/) s[p] += $NF; else c[p] += $NF }
      END { for (p in s) printf "kubelet:%s %s %s\n", p, s[p], c[p] }'
  innet curl -s "http://127.0.0.1:9808/metrics" |
    awk '/^flexd_callout_duration_seconds_(sum|count)\{/ && /callout="mount"/ { if ($1 ~ /_sum/) s += $2; else c += $2 }
      END { printf "flexd:mount %s %s\n", s + 0, c + 0 }'
}
# The means since the last call: kubelet's whole MountVolume per plugin, flexd's driver call-out
# ("SOURCE MEAN COUNT" lines in $D/run/means), printed.
where_time_goes() {
  mount_metrics >"$D/run/metrics.now"
  awk 'NR == FNR { s0[$1] = $2; c0[$1] = $3; next }
    { n = $3 - c0[$1]; if (n > 0) printf "%s %.6f %d\n", $1, ($2 - s0[$1]) / n, n }' \
    "$D/run/metrics.before" "$D/run/metrics.now" >"$D/run/means"
  awk '{ printf "    %s: %.3fs mean over %d\n", $1, $2, $3 }' "$D/run/means" |
    sed 's/kubelet:e2e\/hostdir/kubelet volume_mount, FlexVolume plugin/;
      s/kubelet:kubernetes.io\/csi:.*:/kubelet volume_mount, CSI plugin (flexd):/;
      s/kubelet:grpc:\([A-Za-z]*\):/kubelet'"'"'s \1 calls to flexd:/;
      s/flexd:mount/flexd mount call-out (the driver itself)/'
  mv "$D/run/metrics.now" "$D/run/metrics.before"
}

# MountVolume outside the driver, per path, for the pods since .mount-times was emptied: kubelet's
# volume_mount mean for the path's plugin minus the mean of the driver's own runs on that path
# (CSI targets end in /mount below kubernetes.io~csi; FlexVolume targets are below e2e~hostdir).
overhead() { # WHAT
  awk -v what="$1" 'NR == FNR { mean[$1] = $2; next }
    { path = ($2 ~ /kubernetes.io~csi/) ? "flexd" : "kubelet"; sum[path] += $1 / 1e9; n[path]++ }
    END {
      for (p in mean) { if (p ~ /^kubelet:kubernetes.io\/csi/) csi = mean[p]; else if (p == "kubelet:e2e/hostdir") flex = mean[p] }
      if (!n["kubelet"] || !n["flexd"] || csi == "" || flex == "") { print what ": overhead not measured (no timings)"; exit }
      driver = sum["flexd"] / n["flexd"]
      k = flex - sum["kubelet"] / n["kubelet"]; f = csi - driver
      printf "MountVolume overhead outside the driver, %s: kubelet FlexVolume %.3fs (%.3fs - driver %.3fs), flexd %.3fs (%.3fs - driver %.3fs) %.2fx\n",
        what, k, flex, sum["kubelet"] / n["kubelet"], f, csi, driver, f / k
      # Where flexd'"'"'s went, per MountVolume: kubelet'"'"'s side, flexd'"'"'s, the driver'"'"'s start.
      publish = mean["kubelet:grpc:NodePublishVolume"]; callout = mean["flexd:mount"]
      if (publish == "" || callout == "") exit
      printf "    of flexd'"'"'s: kubelet'"'"'s CSI plugin outside NodePublishVolume %.3fs, NodePublishVolume outside the call-out %.3fs, the call-out outside the driver'"'"'s own run %.3fs\n",
        csi - publish, publish - callout, callout - driver }' \
    "$D/run/means" "$D/volumes/.mount-times"
}

report() { # WHAT: one line from $D/run/startup-{kubelet,flexd}
  local k f
  k=$(median <"$D/run/startup-kubelet") f=$(median <"$D/run/startup-flexd")
  awk -v what="$1" -v k="$k" -v f="$f" 'BEGIN { printf "%s: kubelet FlexVolume %.2fs, flexd %.2fs (median) %.2fx\n", what, k, f, f / k }'
}

mount_metrics >"$D/run/metrics.before"
for speed in fast slow; do
  : >"$D/run/startup-kubelet"
  : >"$D/run/startup-flexd"
  for i in $(seq "$SEQUENTIAL"); do
    for path in kubelet flexd; do
      name=seq-$speed-$path-$i
      bench_pod "$name" $path $speed
      label "$name"
      wait_for 300 "$name Ready" ready_seen "$name"
      startup "$name" >>"$D/run/startup-$path"
      delete_pod "$name" >/dev/null
    done
  done
  report "pod start-up, $speed driver, $SEQUENTIAL pods one after another"
  where_time_goes

  : >"$D/run/startup-kubelet"
  : >"$D/run/startup-flexd"
  : >"$D/volumes/.mount-times"
  for path in kubelet flexd; do
    profiler=
    if [ -n "${PROFILE:-}" ]; then
      rm -f "$D/run/profiling"
      READY=$D/run/profiling "$bench_dir/profile/driver-runs.sh" hostdir >"$D/run/profile-$path" &
      profiler=$!
      wait_for 60 "the profiler" test -e "$D/run/profiling"
    fi
    creating=()
    for i in $(seq "$CONCURRENT"); do
      bench_pod "par-$speed-$path-$i" $path $speed &
      creating+=($!)
    done
    wait "${creating[@]}"
    for i in $(seq "$CONCURRENT"); do label "par-$speed-$path-$i"; done
    for i in $(seq "$CONCURRENT"); do
      wait_for 600 "par-$speed-$path-$i Ready" ready_seen "par-$speed-$path-$i"
      startup "par-$speed-$path-$i" >>"$D/run/startup-$path"
    done
    if [ -n "$profiler" ]; then
      kill -TERM $profiler && wait $profiler || true
    fi
    delete_all
  done
  report "pod start-up, $speed driver, $CONCURRENT pods at once"
  where_time_goes
  overhead "$speed driver, $CONCURRENT pods at once"
  [ -z "${PROFILE:-}" ] || sed 's/^/    /' "$D/run/profile-kubelet" "$D/run/profile-flexd"
done

