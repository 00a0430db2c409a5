# kubelet as the oracle (sourced by tests/e2e/run.sh; docs/oracle.md says what is compared and
# lists every difference). The same drivers, behind a recording wrapper (cmd/recorder), serve
# the same volumes twice: once through kubelet's and kube-controller-manager's own FlexVolume
# plugin, once through flexd after `flexd migrate`. The call-outs each driver saw are then
# compared record by record (oracle.jq), paths and pod UIDs normalised in one place there. The
# discovery scenario (further down) watches one driver change under both.

ORACLE_HOSTDIR=e2e/rec-hostdir # the hostdir driver: node-only
ORACLE_LOOP=e2e/rec-loop       # flexd's builtin loop driver: attaches
# The records: under the loop driver's image dir, which flexd's manifests mount at its host
# path in both of flexd's pods (the controller's runs attach and detach in its own container).
oracle_dir() { echo "$D/loop-images/oracle"; }
ORACLE_POD=oracle

# oracle_install NAME REAL: the recorder as driver NAME in front of the executable REAL.
oracle_install() {
  local dir="$D/plugins/${1/\//\~}"
  mkdir -p "$dir"
  jq -n --arg exec "$2" --arg log "$(oracle_dir)/records.jsonl" '{exec: $exec, log: $log}' \
    >"$dir/recorder.json"
  "$D/bin/flexd" --plugin-dir "$D/plugins" install --driver "$1" "$D/bin/recorder" >&2
}

oracle_objects() { # the FlexVolume objects: two PVs and their claims, the Secret
  kubectl apply -f - <<EOF
apiVersion: v1
kind: Secret
metadata: {name: oracle-secret, namespace: default}
# FlexVolume reads only a Secret whose type is the driver's name.
type: $ORACLE_HOSTDIR
stringData: {password: not-a-real-secret, user: oracle}
---
$(pv_yaml oracle-hostdir 1Gi "flexVolume: {driver: $ORACLE_HOSTDIR, options: {volume: oracle-hostdir,
    greeting: from a PV}, secretRef: {name: oracle-secret, namespace: default}}")
---
$(pv_yaml oracle-loop 64Mi "flexVolume: {driver: $ORACLE_LOOP, fsType: ext4, options: {size: 64Mi}}")
EOF
  wait_for 60 "claim oracle-hostdir Bound" claim_bound oracle-hostdir
  wait_for 60 "claim oracle-loop Bound" claim_bound oracle-loop
}

# The pod, as FlexVolume knew it: both claims, and an inline read-only volume with a secret; an
# fsGroup and a non-root user, so ownership is applied.
oracle_pod_yaml() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $ORACLE_POD, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000}
  containers:
  - name: main
    image: $TOOLS_IMAGE
    imagePullPolicy: Never
    command: [/bin/sh, -c, 'cat /pv/driver /inline/driver; stat -c "%n %g %A" /pv /loop; echo \$1 > /loop/\$1; ls /loop; echo DONE; exec sleep 3600', sh]
    args: [written]
    volumeMounts:
    - {name: pv, mountPath: /pv}
    - {name: loop, mountPath: /loop}
    - {name: inline, mountPath: /inline, readOnly: true}
  volumes:
  - name: pv
    persistentVolumeClaim: {claimName: oracle-hostdir}
  - name: loop
    persistentVolumeClaim: {claimName: oracle-loop}
  - name: inline
    flexVolume:
      driver: $ORACLE_HOSTDIR
      readOnly: true
      options: {volume: oracle-inline, greeting: inline}
      secretRef: {name: oracle-secret}
EOF
}

no_attachments() {
  [ -z "$(kubectl get node $NODE -o jsonpath='{.status.volumesAttached}')" ] &&
    [ -z "$(kubectl get volumeattachment -o name)" ]
}

# oracle_run LABEL MANIFEST: the pod up, its reads right, then gone with everything unmounted
# and detached.
oracle_run() {
  local label=$1 manifest=$2
  kubectl create -f "$manifest"
  pod_ready $ORACLE_POD 240
  cp "$D/run/$ORACLE_POD.log" "$D/run/oracle-$label.log"
  delete_pod $ORACLE_POD
  wait_for 120 "no volume of $ORACLE_POD mounted" oracle_unmounted
  wait_for 180 "every volume detached" no_attachments
}

oracle_unmounted() { ! findmnt -rn -o TARGET | grep -E "oracle-(hostdir|loop|inline)|/oracle/" >/dev/null; }

# 11. kubelet as the oracle: docs/oracle.md.
scenario_oracle() {
  rm -f "$D/logs/scenario-oracle.summary"
  [ -x "$D/plugins/flexd~loop/loop" ] ||
    "$D/bin/flexd" --plugin-dir "$D/plugins" install --builtin loop --image-dir "$D/loop-images" >&2
  mkdir -p "$(oracle_dir)"
  rm -f "$(oracle_dir)"/*.jsonl
  oracle_install $ORACLE_HOSTDIR "$D/run/hostdir"
  oracle_install $ORACLE_LOOP "$D/plugins/flexd~loop/loop"
  apply_all_manifests
  quirk_pods
  oracle_objects
  oracle_pod_yaml >"$D/run/oracle-pod.yaml"
  # Through kubelet's own FlexVolume plugin (and kube-controller-manager's for attach).
  oracle_run kubelet "$D/run/oracle-pod.yaml"

  # The cut-over (docs/migration.md#cut-over), then the same pod through flexd.
  kubectl get pv oracle-hostdir oracle-loop -o yaml |
    "$D/bin/flexd" --plugin-dir "$D/plugins" migrate -f - >"$D/run/oracle-pvs.yaml"
  "$D/bin/flexd" --plugin-dir "$D/plugins" migrate -f "$D/run/oracle-pod.yaml" >"$D/run/oracle-pod-csi.yaml"
  kubectl delete pv oracle-hostdir oracle-loop --wait=false
  kubectl patch pv oracle-hostdir -p '{"metadata":{"finalizers":null}}' || true
  kubectl patch pv oracle-loop -p '{"metadata":{"finalizers":null}}' || true
  wait_for 60 "the FlexVolume PVs to go" pv_gone oracle-hostdir
  wait_for 60 "the FlexVolume PVs to go" pv_gone oracle-loop
  kubectl create -f "$D/run/oracle-pvs.yaml"
  wait_for 120 "claim oracle-hostdir Bound again" claim_bound oracle-hostdir
  wait_for 120 "claim oracle-loop Bound again" claim_bound oracle-loop
  oracle_run flexd "$D/run/oracle-pod-csi.yaml"

  # The pod saw the same volumes both times.
  diff <(sed 's/written//' "$D/run/oracle-kubelet.log") <(sed 's/written//' "$D/run/oracle-flexd.log")
  oracle_compare "$(oracle_dir)/records.jsonl"
  oracle_where_kubelet_fails
}

# --- where kubelet is known to fail (docs/oracle.md#where-kubelet-fails) --------------------
# The hostdir driver's quirk option, through kubelet's FlexVolume plugin (an inline flexVolume)
# and through flexd (an inline CSI volume), in the same cluster at the same time.

quirk_volume() { # PATH QUIRK: the volume yaml of pod oracle-QUIRK-PATH
  case $1 in
    kubelet) echo "    flexVolume: {driver: $DRIVER, options: {volume: oracle-$2-kubelet, quirk: $2}}" ;;
    flexd) echo "    csi: {driver: $CSI_NAME, volumeAttributes: {volume: oracle-$2-flexd, quirk: $2}}" ;;
  esac
}
pod_ready_now() { [ "$(kubectl get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
pod_gone() { ! kubectl get pod "$1"; }
failed_mount() { # POD: the message of its last FailedMount event
  kubectl get events --field-selector "involvedObject.name=$1,reason=FailedMount" -o json |
    jq -r '.items[-1].message // empty'
}
first_failed_mount_after() { # POD: seconds from its creation to its first FailedMount event
  local created
  created=$(kubectl get pod "$1" -o jsonpath='{.metadata.creationTimestamp}')
  kubectl get events --field-selector "involvedObject.name=$1,reason=FailedMount" -o json |
    jq -r --arg created "$created" '[.items[] | .firstTimestamp // .eventTime | sub("\\.[0-9]+"; "") | fromdateiso8601]
      | min - ($created | fromdateiso8601)'
}
failed_mount_says() { failed_mount "$1" | grep -q -- "$2"; }
hung_driver() { pgrep -f "hostdir mount .*oracle-hang-$1" >/dev/null; }
no_hung_driver() { ! hung_driver "$1"; }

oracle_where_kubelet_fails() { where_kubelet_fails 2>&1 | tee -a "$D/logs/scenario-oracle.summary"; }

# The quirk pods start before the comparison, so the hanging mounts' 2 minutes pass meanwhile.
quirk_pods() {
  local path
  QUIRKS_STARTED=$SECONDS
  for path in kubelet flexd; do
    pod_create oracle-chatty-$path 'stat -c "group %g" /data' "$(quirk_volume $path chatty)" "{fsGroup: 2000}"
    pod_create oracle-hang-$path 'cat /data/driver' "$(quirk_volume $path hang)"
  done
}

where_kubelet_fails() {
  local started=$QUIRKS_STARTED
  # A log line before the JSON: kubelet cannot parse the reply and fails SetUp, but the driver
  # did mount; kubelet's retry finds the dir mounted and returns early, skipping the fsGroup
  # ownership. flexd reads the JSON after the line: no failure, ownership applied.
  pod_ready oracle-chatty-flexd 120 >/dev/null
  grep -qx 'group 2000' "$D/run/oracle-chatty-flexd.log"
  if [ -n "$(failed_mount oracle-chatty-flexd)" ]; then echo "flexd failed a mount of the chatty driver"; return 1; fi
  wait_for 120 "kubelet's FailedMount for oracle-chatty-kubelet" failed_mount_says oracle-chatty-kubelet 'invalid character'
  pod_ready oracle-chatty-kubelet 180 >/dev/null
  if grep -qx 'group 2000' "$D/run/oracle-chatty-kubelet.log"; then echo "kubelet applied fsGroup after all"; return 1; fi
  echo "where kubelet fails: a driver that logs a line before its JSON (the pod has fsGroup 2000)"
  echo "  kubelet: SetUp fails ($(failed_mount oracle-chatty-kubelet | cut -c1-120)); the retry finds the mount the driver made and skips ownership: /data $(cat "$D/run/oracle-chatty-kubelet.log" | head -1)"
  echo "  flexd:   Ready, no FailedMount, /data $(head -1 "$D/run/oracle-chatty-flexd.log")"

  # A mount that never returns (Kubernetes #31272), in both pods since the start.
  wait_for 60 "the kubelet path's hanging mount" hung_driver kubelet
  wait_for 60 "the flexd path's hanging mount" hung_driver flexd
  local kubelet_driver flexd_driver
  kubelet_driver=$(pgrep -of "hostdir mount .*oracle-hang-kubelet")
  flexd_driver=$(pgrep -of "hostdir mount .*oracle-hang-flexd")
  # flexd kills the driver at its call-out timeout (2 min); kubelet's CSI call ends at its own
  # deadline (also 2 min) and is retried.
  wait_for 300 "a FailedMount for oracle-hang-flexd" failed_mount_says oracle-hang-flexd .
  local answered
  answered=$(first_failed_mount_after oracle-hang-flexd)
  if kill -0 "$flexd_driver" 2>/dev/null; then echo "flexd answered, its driver still runs"; return 1; fi
  # kubelet's FlexVolume plugin has no timeout for mount: no answer, the driver still running.
  if [ -n "$(failed_mount oracle-hang-kubelet)" ]; then echo "kubelet's mount returned"; return 1; fi
  kill -0 "$kubelet_driver"
  echo "where kubelet fails: a driver whose mount never returns (Kubernetes #31272)"
  echo "  kubelet: after $((SECONDS - started))s no answer, no event, the pod ContainerCreating, the driver (pid $kubelet_driver) running for $(ps -o etimes= -p "$kubelet_driver" | tr -d ' ')s"
  echo "  flexd:   the driver killed at flexd's call-out timeout (2 min); kubelet's CSI call ended ${answered}s after the pod's creation and is retried: $(failed_mount oracle-hang-flexd | cut -c1-160)"
  kubectl delete pod oracle-hang-kubelet oracle-hang-flexd --wait=false
  wait_for 120 "oracle-hang-kubelet to go" pod_gone oracle-hang-kubelet
  # kubelet let the pod go, but its operation and the driver stay until killed by hand.
  kill -0 "$kubelet_driver"
  # Cleanup: the driver of flexd's retry (kubelet retried the publish) would end at flexd's
  # timeout, up to 2 more minutes, and the pod's unpublish waits for it; end both here.
  pkill -f "hostdir mount .*oracle-hang-" || true
  wait_for 120 "oracle-hang-flexd to go" pod_gone oracle-hang-flexd
  kubectl delete pod oracle-chatty-kubelet oracle-chatty-flexd --wait=true --timeout=120s
}

oracle_compare() { # RECORDS: the report; fails on a difference docs/oracle.md does not list
  local report
  report=$(jq -n -r --slurpfile records "$1" --arg root "$D" -f "$here/oracle.jq")
  echo "$report" | tee -a "$D/logs/scenario-oracle.summary"
  tail -1 <<<"$report" | grep -qx 'oracle: 0 differences not listed in docs/oracle.md'
}

# --- discovery, side by side (docs/oracle.md#discovery) ---------------------------------------
# One driver, e2e/disco, changed in the plugin dir while kubelet's FlexVolume prober and flexd
# both watch it. After each change, a pod through each path (an inline flexVolume, an inline CSI
# volume) says which version is usable, if any: both must agree. The time from the change to
# each pod's Ready is reported (how soon each path noticed), never asserted.

DISCO=e2e/disco
DISCO_CSI=flexvolume-e2e--disco

disco_version() { # N: the hostdir driver, its volumes' file saying "disco-vN"
  sed "s|^ROOT=.*|ROOT=$D/volumes|; s|printf 'hostdir %s %s|printf 'disco-v$1 %s %s|" \
    "$here/drivers/hostdir" >"$D/run/disco-v$1"
  chmod 0755 "$D/run/disco-v$1"
}

all_failed_or_ready() { # STEP READY-PATH...: every path not Ready has a failed mount
  local step=$1 path; shift
  for path in kubelet flexd; do
    [[ " $* " == *" $path "* ]] || [ -n "$(failed_mount disco-$step-$path)" ] || return 1
  done
}

disco_volume() { # PATH VOLUME
  case $1 in
    kubelet) echo "    flexVolume: {driver: $DISCO, options: {volume: $2}}" ;;
    flexd) echo "    csi: {driver: $DISCO_CSI, volumeAttributes: {volume: $2}}" ;;
  esac
}

# Each pod's Ready time, EPOCH seconds with microseconds, empty when not Ready.
ready_times() {
  kubectl get pods disco-$1-kubelet disco-$1-flexd -o json | jq -r '.items[]
    | "\(.metadata.name | sub(".*-"; "")) \(.status.conditions // [] | map(select(.type == "Ready" and .status == "True")) | length)"'
}

# disco_step NAME EXPECTED CHANGED: EXPECTED is a version ("v2") or "none"; CHANGED the
# $EPOCHREALTIME when the change began. Both pods in one request, so neither path goes first.
disco_step() {
  local step=$1 expected=$2 changed=$3 path pod verdict deadline=$((SECONDS + 60))
  local -A ready=()
  {
    pod_manifest disco-$step-kubelet 'cat /data/driver' "$(disco_volume kubelet disco-$step-kubelet)"
    echo ---
    pod_manifest disco-$step-flexd 'cat /data/driver' "$(disco_volume flexd disco-$step-flexd)"
  } | kubectl apply -f - >/dev/null
  # Usable: Ready (a pod takes seconds here). Unusable: not Ready by 60 s, or with a failed
  # mount and still not Ready 15 s after the change (a usable path's early failure, e.g.
  # before flexd registered a new driver, is retried within a second or two).
  local settled=$((SECONDS + 15))
  while ((SECONDS < deadline)) && [ ${#ready[@]} -lt 2 ]; do
    while read -r path count; do
      [ "$count" = 1 ] && [ -z "${ready[$path]:-}" ] && ready[$path]=$EPOCHREALTIME
    done < <(ready_times $step)
    if ((SECONDS >= settled)) && all_failed_or_ready $step "${!ready[@]}"; then break; fi
    sleep 0.2
  done
  local line="step $step:"
  for path in kubelet flexd; do
    pod=disco-$step-$path
    if [ -n "${ready[$path]:-}" ]; then
      wait_for 30 "$pod's output" script_done "$pod"
      verdict=$(kubectl logs "$pod" | awk 'NR == 1 {print $1}' | sed 's/^disco-//')
      line+=" $path $verdict, Ready $(awk -v a="$changed" -v b="${ready[$path]}" 'BEGIN { printf "%.1f", b - a }')s after the change;"
    else
      verdict=none
      line+=" $path none ($(failed_mount "$pod" | cut -c1-110));"
    fi
    [ "$verdict" = "$expected" ] || { echo "$line expected $expected"; return 1; }
  done
  echo "$line flexd noticed the change after $(flexd_noticed "$changed") ms (kubelet's prober looks at its next volume operation)"
  kubectl delete pod disco-$step-kubelet disco-$step-flexd --wait=true --timeout=120s >/dev/null
}

flexd_noticed() { # CHANGED: milliseconds from then to flexd's first log of the driver's change
  kubectl -n $NAMESPACE logs "$(flexd_pod)" | jq -r --argjson t "$1" --arg driver $DISCO '
    select(.driver == $driver and (.message == "driver changed" or .message == "driver failed"))
    | (.timestamp | capture("(?<s>.*)\\.(?<f>[0-9]+)Z") | (.s + "Z" | fromdateiso8601) + ("0." + .f | tonumber)) as $at
    | select($at >= $t) | ($at - $t) * 1000 | floor' 2>/dev/null | head -1
}

# disco_change STEP EXPECTED COMMAND...: the change, then the step, timed from the change's start.
disco_change() {
  local step=$1 expected=$2 changed=$EPOCHREALTIME; shift 2
  "$@" >/dev/null
  disco_step "$step" "$expected" "$changed"
}

scenario_discovery() { discovery_steps 2>&1 | tee "$D/logs/scenario-discovery.summary"; }

discovery_steps() {
  local dir="$D/plugins/${DISCO/\//\~}" n
  for n in 1 2 3 4; do disco_version $n; done
  printf '#!/bin/sh\necho "this is not JSON"\n' >"$D/run/disco-broken"
  chmod 0755 "$D/run/disco-broken"
  # The CSIDriver object an operator applies once per driver (flexd manifests prints it).
  kubectl apply -f - >/dev/null <<EOF2
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $DISCO_CSI}
spec: {attachRequired: false, podInfoOnMount: true, fsGroupPolicy: File, volumeLifecycleModes: [Persistent, Ephemeral]}
EOF2
  local install=("$D/bin/flexd" --plugin-dir "$D/plugins" install --driver $DISCO)
  disco_change installed v1 "${install[@]}" "$D/run/disco-v1"
  disco_change updated-in-place v2 "${install[@]}" "$D/run/disco-v2"
  disco_change broken-init none "${install[@]}" "$D/run/disco-broken"
  disco_change fixed v3 "${install[@]}" "$D/run/disco-v3"
  disco_change removed none rm -rf "$dir"
  # By hand, not atomically: the directory, then the executable copied into it.
  disco_change recreated-by-hand v4 sh -c "mkdir '$dir' && cp '$D/run/disco-v4' '$dir/disco'"
  rm -rf "$dir"
  kubectl delete csidriver $DISCO_CSI >/dev/null
}
