#!/usr/bin/env bash
# A real Kubernetes cluster (pinned in tests/e2e/go.mod; one node, or E2E_NODES) for flexd, as root: what
# tests/e2e/run.sh brings up and tears down, and what the scenarios (tests/e2e/scenarios, Go)
# call for the node's own faults. Sourced by run.sh and bench/pod-startup.sh; run directly:
#
#   tests/e2e/cluster.sh up              build what is missing, start the cluster
#   tests/e2e/cluster.sh down            stop and remove everything `up` made (idempotent)
#   tests/e2e/cluster.sh restart-kubelet kill kubelet and start it again (the faults scenarios)
#   tests/e2e/cluster.sh restart-node    kill every process of the cluster, unmount and remove
#                                        its cgroups, start it all again (a node's reboot)
#   tests/e2e/cluster.sh stop-node NAME  a worker lost: every process of it killed, its mounts
#                                        and loop devices gone; it stays down
#   tests/e2e/cluster.sh start-node NAME that worker booted again, until it is Ready
#
# Environment: E2E_NAME (default flexd-e2e) names the network namespace, the cgroup root and the
# default scratch dir, so clusters with different names coexist on one host; E2E_DIR (scratch
# dir, default /var/lib/$E2E_NAME: never a temporary dir, which flexd manifests refuses to
# deploy), E2E_PLUGIN_DIR (the FlexVolume plugin dir every node's kubelet and
# kube-controller-manager are given, an absolute path outside E2E_DIR, e.g. OpenShift 4's
# /etc/kubernetes/kubelet-plugins/volume/exec: see "The plugin dir" below; default
# $E2E_DIR/plugins), FLEXD (a flexd binary to use instead of `cargo build --release -p flexd`), E2E_NODES
# (default 1: how many nodes; stop-node, start-node and down find the workers by themselves),
# E2E_KCM_API_QPS (kube-controller-manager's --kube-api-qps, its burst twice that; default its
# own, 20: bench/attach-scale.sh measures both).
#
# Where it all runs. One network namespace, $E2E_NAME (default flexd-e2e), made here: `lo` and
# the node's address (10.77.0.1/32, on a dummy interface, or on lo where the kernel has no dummy), nothing that
# leads out. etcd, the control plane, containerd and kubelet run in it; pods are either
# hostNetwork (in it too) or on a bridge inside it (the controller Deployment, the storage
# suite's pods): nothing is sent to any address outside that namespace. They also run in a pid
# namespace of their own whose init is the pause binary (it reaps): a hostPID pod's /proc/1 is
# then that init, which flexd's --driver-mount-namespace=/proc/1/ns/mnt needs (the machine's own
# pid 1 may be unreadable), and `down` ends every process of the cluster, containers included,
# by killing that one init. The pid namespace needs its own /proc (runc reads /proc/<its pid>),
# so a mount namespace too, made from the host's with propagation unchanged: everything on disk
# is under E2E_DIR, a shared bind mount of itself, so every mount kubelet, containerd and the
# drivers make there is seen on the host (and Bidirectional propagation, which needs a shared
# mount, works). Under E2E_DIR: etcd, certificates, containerd's root and state, kubelet's root
# dir, the FlexVolume plugin dir, flexd's state dir, the volumes' data; cgroups are under
# /$E2E_NAME in every hierarchy (kubelet's cgroupRoot), and each daemon has a CPU cgroup of its
# own there, system.slice/<name>.service, as on a systemd node (see in_service_cgroup);
# /run/containerd is a tmpfs of the cluster's mount namespace.
#
# With E2E_NODES > 1, all that is node 0, and each worker is a kubelet and containerd in network,
# pid, mount and uts namespaces of its own, on a bridge in node 0's network namespace (which then
# holds the node's address): the node table below says what is whose.
#
# The plugin dir. Each node's plugin dir is on disk under E2E_DIR (node 0's $E2E_DIR/plugins, a
# worker's under nodes/NAME), where `up` installs drivers and the scenarios read and write it
# from the host. Distributions give kubelet another path (docs/operator-guide.md#distributions):
# with E2E_PLUGIN_DIR set, each node's own plugin dir is bind-mounted at that path in the node's
# mount namespace only, so its kubelet, kube-controller-manager and the pods' hostPath volumes
# (flexd's, the installer's) all go by the distribution's path, as on such a node, while the
# host sees nothing mounted there. The dirs of that path the host lacked are made empty (the
# mount points), recorded, and removed again by `down`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# Everything of this run that the host sees by name derives from E2E_NAME: two runs with
# different names share nothing but the cached kube binary and /run/containerd's (empty) dir.
E2E_NAME=${E2E_NAME:-flexd-e2e}
case $E2E_NAME in '' | */* | *[!A-Za-z0-9_.-]*) echo "E2E_NAME=$E2E_NAME: letters, digits, . _ - only" >&2; exit 2 ;; esac
D=${E2E_DIR:-/var/lib/$E2E_NAME}
NETNS=$E2E_NAME
NODE_IP=10.77.0.1
NODE=flexd-e2e
CGROUP_ROOT=$E2E_NAME
DRIVER=e2e/hostdir
CSI_NAME=flexvolume-e2e--hostdir
FLEXD_IMAGE=localhost/flexd:e2e
PAUSE_IMAGE=localhost/pause:e2e
TOOLS_IMAGE=localhost/e2e-tools:e2e
INSTALLER_IMAGE=localhost/flexd-installer:e2e
# Where the flexd and installer images come from: "dockerfile" (the default, and CI's) builds
# them from deploy/Dockerfile with buildah (tests/e2e/images.sh), as an operator does; "binary"
# packs $FLEXD (or a release build) with this host's tools, for a quicker loop while working on
# flexd itself. Either way the previous build (FLEXD_PREVIOUS_IMAGE, $FLEXD packed so) is there
# for the rollout scenario to roll from (with "binary", the same binary under another tag).
E2E_IMAGES=${E2E_IMAGES:-dockerfile}
FLEXD_PREVIOUS_IMAGE=localhost/flexd:e2e-previous
NAMESPACE=flexd-system
TOKEN=flexd-e2e-admin-token-0123456789abcdef
# The storage scenario's driver with a controller side: flexd's builtin loop driver.
LOOP_DRIVER=flexd/loop
LOOP_CSI_NAME=flexvolume-flexd--loop
# The CSI sidecars (tests/e2e/sidecars/, from the Go module proxy) as images of their own.
SIDECARS=(csi-provisioner csi-attacher csi-resizer)
# `flexd manifests`' flags for them: every one, since a driver's shape decides which it gets.
SIDECAR_IMAGES=()
for sidecar in "${SIDECARS[@]}"; do SIDECAR_IMAGES+=("--${sidecar#csi-}-image" "localhost/$sidecar:e2e"); done
# The one Service pods use (in-cluster config of the sidecars), made reachable without kube-proxy.
API_SERVICE_IP=10.0.0.1
POD_SUBNET=10.88.0.0/24
# How many nodes (issue #35): node 0 is the one above, with the control plane; every other one
# (a worker) is a kubelet and containerd of its own in namespaces of its own (see the node table).
E2E_NODES=${E2E_NODES:-1}
case ${E2E_KCM_API_QPS:-1} in *[!0-9]* | 0*) echo "E2E_KCM_API_QPS=$E2E_KCM_API_QPS: a number of requests a second" >&2; exit 2 ;; esac
case $E2E_NODES in '' | *[!0-9]* | 0*) echo "E2E_NODES=$E2E_NODES: a number from 1 to 50" >&2; exit 2 ;; esac
((E2E_NODES <= 50)) || { echo "E2E_NODES=$E2E_NODES: a number from 1 to 50" >&2; exit 2; }
# Kubelet's and kube-controller-manager's plugin dir (see "The plugin dir" above). The default is
# node 0's own dir itself, with no mount at all. Another path is refused where it would break the
# cluster or what flexd deploys: relative, or "." or ".." in it (the mount and Kubernetes'
# hostPath would not agree on it), under the scratch dir (node 0's plugin dir, or a worker's, or
# a dir of the cluster's would be hidden by the mount), holding the scratch dir (hidden in turn),
# or a temporary dir (flexd manifests refuses to deploy one). The paths go into command lines,
# YAML and the scenarios' word lists as they are: no space nor anything to quote.
PLUGIN_DIR=${E2E_PLUGIN_DIR:-$D/plugins}
while [[ $PLUGIN_DIR == ?*/ ]]; do PLUGIN_DIR=${PLUGIN_DIR%/}; done
if [ "$PLUGIN_DIR" != "$D/plugins" ]; then
  plugin_dir_refused() { echo "E2E_PLUGIN_DIR=$E2E_PLUGIN_DIR: $*" >&2; exit 2; }
  case $PLUGIN_DIR in /*) ;; *) plugin_dir_refused "not an absolute path" ;; esac
  case $PLUGIN_DIR in *[!A-Za-z0-9_./-]*) plugin_dir_refused "letters, digits, . _ - / only" ;; esac
  # Compared as the kernel resolves them (a link on the way counts).
  canonical_plugin_dir=$(realpath -m "$PLUGIN_DIR") canonical_dir=$(realpath -m "$D")
  case $canonical_plugin_dir/ in "$canonical_dir"/*) plugin_dir_refused "under the scratch dir $D (E2E_DIR); leave E2E_PLUGIN_DIR unset for $D/plugins" ;; esac
  # (/ as the empty string, so that "$holder"/* is the dirs under it too.)
  holder=${canonical_plugin_dir%/}
  case $canonical_dir/ in "$holder"/*) plugin_dir_refused "holds the scratch dir $D (E2E_DIR), which the mount would hide" ;; esac
  case $PLUGIN_DIR/ in *//* | */./* | */../*) plugin_dir_refused "holds an empty, . or .. component" ;; esac
  for temporary in /tmp /var/tmp /dev/shm /run/user /run/shm; do
    case $canonical_plugin_dir/ in "$temporary"/*) plugin_dir_refused "under $temporary, a temporary dir (flexd manifests refuses to deploy it)" ;; esac
  done
  unset canonical_plugin_dir canonical_dir holder temporary
fi
# The bridge in node 0's network namespace that the workers' network namespaces hang on, once
# there is more than one node.
NODES_BRIDGE=e2e-nodes

# --- the node table ---------------------------------------------------------------------------
#
# Node I (0 <= I < E2E_NODES). Node 0 is the single node of before, unchanged: its name, network
# namespace, address, pod subnet, cgroup root and files (at the scratch dir's top). Worker I has
# its own network namespace $NETNS-wI (a veth to the bridge $NODES_BRIDGE in node 0's, address
# 10.77.0.<I+1>, pods on 10.88.<I>.0/24, routed to and from every other node's), its own pid,
# mount and uts namespaces (hostname: the node's name, which flexd's default node name is), its
# own containerd and kubelet, its cgroups under /$CGROUP_ROOT/NAME (so that down's removal of
# /$CGROUP_ROOT takes them too) and its own files under $D/nodes/NAME. One DaemonSet has one
# hostPath per dir, so a worker's kubelet dir, plugin dir and flexd state dir are bind mounts of
# its own over the same paths as node 0's ($D/kubelet, $D/plugins, $D/flexd-state) in its mount
# namespace, which is a slave of the host's: it sees everything else under $D (the volumes, the
# loop images: the nodes' shared storage), and nothing it mounts reaches the host or another node.
node_name() { if (($1 == 0)); then echo $NODE; else echo $NODE-w$1; fi; }
node_netns() { if (($1 == 0)); then echo $NETNS; else echo $NETNS-w$1; fi; }
node_ip() { echo 10.77.0.$(($1 + 1)); }
node_subnet() { if (($1 == 0)); then echo $POD_SUBNET; else echo 10.88.$1.0/24; fi; }
node_dir() { if (($1 == 0)); then echo "$D"; else echo "$D/nodes/$(node_name $1)"; fi; }
node_cgroup_root() { if (($1 == 0)); then echo $CGROUP_ROOT; else echo $CGROUP_ROOT/$(node_name $1); fi; }
# node_log I NAME: the log of a node's daemon NAME (node 0's as before).
node_log() { if (($1 == 0)); then echo "$D/logs/$2.log"; else echo "$D/logs/$(node_name $1).$2.log"; fi; }
node_indexes() { seq 0 $((E2E_NODES - 1)); }
worker_indexes() { seq 1 $((E2E_NODES - 1)); }
# The workers a scratch dir holds, whatever E2E_NODES says now (down removes what up made).
workers_made() {
  local dir
  for dir in "$D"/nodes/"$NODE"-w*; do
    [ -d "$dir" ] && echo "${dir##*-w}"
  done | sort -n
}

log() { echo "[e2e $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
skip() { echo "E2E SKIPPED: $*"; echo "0 passed, 0 failed"; exit 0; }

# Commands in the cluster's network namespace; daemons also in its pid namespace.
innet() { nsenter --net=/run/netns/$NETNS "$@"; }
incluster() { nsenter --target "$(cat "$D/run/init.pid")" --pid --mount --net "$@"; }
# innode I COMMAND...: in node I's namespaces (a worker's uts namespace too).
innode() {
  if (($1 == 0)); then shift; incluster "$@"; return; fi
  local dir; dir=$(node_dir $1); shift
  nsenter --target "$(cat "$dir/run/init.pid")" --pid --mount --net --uts "$@"
}
kubectl() { innet "$D/bin/kube" kubectl --kubeconfig="$D/kubeconfig" "$@"; }
ctr() { command ctr --address "$D/containerd/containerd.sock" --namespace k8s.io "$@"; }
# ctr_on I ARGS...: ctr for node I's containerd (its socket is a file on the host too).
ctr_on() { local i=$1; shift; command ctr --address "$(node_dir $i)/containerd/containerd.sock" --namespace k8s.io "$@"; }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND (quietly) until it succeeds.
wait_for() {
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${seconds}s waiting for $what"
      return 1
    fi
    sleep 1
  done
}

preflight() {
  [ "$(id -u)" = 0 ] || skip "not root (the cluster mounts, makes namespaces and cgroups)"
  command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || skip "no Go toolchain (go on PATH or /usr/local/go/bin/go)"
  [ -n "${FLEXD:-}" ] || command -v cargo >/dev/null || skip "no cargo and no FLEXD=path/to/flexd"
  local missing=()
  for tool in containerd containerd-shim-runc-v2 runc ctr umoci nsenter unshare ip nft openssl curl jq busybox; do
    command -v $tool >/dev/null || missing+=("$tool")
  done
  for plugin in loopback bridge host-local; do
    [ -x /usr/lib/cni/$plugin ] || missing+=("/usr/lib/cni/$plugin")
  done
  ((${#missing[@]} == 0)) || skip "missing ${missing[*]} (apt-get install -y containerd runc containernetworking-plugins umoci busybox-static jq curl nftables)"
  case $E2E_IMAGES in
    dockerfile)
      for tool in buildah skopeo mmdebstrap rustc; do
        command -v $tool >/dev/null || missing+=("$tool")
      done
      ((${#missing[@]} == 0)) || skip "missing ${missing[*]} for the images from deploy/Dockerfile (apt-get install -y buildah skopeo mmdebstrap; or E2E_IMAGES=binary)" ;;
    binary) ;;
    *) echo "E2E_IMAGES=$E2E_IMAGES: dockerfile or binary" >&2; exit 2 ;;
  esac
  [ -d /sys/fs/cgroup ] || skip "no /sys/fs/cgroup"
}

# Mounts under the scratch dir but itself, deepest first.
unmount_under() {
  local round mounts
  for round in 1 2 3 4 5; do
    mounts=$(findmnt -rn -o TARGET | awk -v d="$1" 'index($0, d "/") == 1' | sort -r)
    [ -n "$mounts" ] || return 0
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done <<<"$mounts"
  done
  [ -z "$(findmnt -rn -o TARGET | awk -v d="$1" 'index($0, d "/") == 1')" ]
}

# Kubernetes' storage suite (its binary, Ginkgo, its images) only where a storage scenario will
# run: run.sh's E2E_SCENARIOS (every scenario when unset, as for `run.sh up`).
storage_suite_wanted() { [[ " ${SCENARIOS:-storage} " == *" storage "* ]]; }

# disk_room: the scratch dir's filesystem has room for the cluster (E2E_DISK_GIB a node, 3 by
# default: every node's containerd holds every image, packed and unpacked, and the storage
# suite's volumes), or up stops here, saying so, rather than at an image import that fills it.
disk_room() {
  local need_gib=$((${E2E_DISK_GIB:-3} * E2E_NODES)) free_kib
  free_kib=$(df -Pk "$(dirname "$D")" | awk 'NR == 2 {print $4}')
  ((free_kib >= need_gib * 1024 * 1024)) ||
    die "the filesystem of $D has $((free_kib / 1024 / 1024)) GiB free; $E2E_NODES node(s) need about $need_gib GiB (E2E_DISK_GIB=${E2E_DISK_GIB:-3} a node). Free some (Go's build cache: go clean -cache)"
}

# remove_cgroups [node0]: the cluster's cgroups, in every hierarchy. With node0 (a restart of
# node 0), only that node's: the cgroup root stays, and so do the workers' cgroups under it,
# their processes still running (before, the restart waited its 30 s for them and warned).
remove_cgroups() {
  # Deepest first, again and again for up to 30 s: a process killed a moment ago may still be in
  # its cgroup (an exiting process leaves it last), and a busy machine makes that moment long.
  local hierarchy left deadline=$((SECONDS + 30)) workers=() w
  if [ "${1:-}" = node0 ]; then
    for w in $(workers_made); do workers+=("$(node_name "$w")"); done
  fi
  while :; do
    left=()
    for hierarchy in /sys/fs/cgroup/*/"$CGROUP_ROOT" /sys/fs/cgroup/"$CGROUP_ROOT"; do
      [ -d "$hierarchy" ] || continue
      if [ "${1:-}" = node0 ]; then
        # Its dirs under the root but not a worker's, children before their parents.
        cgroups_of_node0 "$hierarchy" "${workers[*]}" | xargs -r rmdir 2>/dev/null || true
        [ -z "$(cgroups_of_node0 "$hierarchy" "${workers[*]}")" ] || left+=("$hierarchy")
      else
        find "$hierarchy" -depth -type d -exec rmdir {} + 2>/dev/null || true
        [ ! -d "$hierarchy" ] || left+=("$hierarchy")
      fi
    done
    ((${#left[@]} > 0)) && ((SECONDS < deadline)) || break
    sleep 1
  done
  for hierarchy in "${left[@]}"; do
    if [ "${1:-}" = node0 ]; then
      log "WARNING: node 0's cgroups under $hierarchy could not be removed in 30 s; processes in them: $(cgroups_of_node0 "$hierarchy" "${workers[*]}" | sed 's|$|/cgroup.procs|' | xargs -r cat 2>/dev/null | tr '\n' ' ')"
    else
      log "WARNING: cgroup $hierarchy could not be removed in 30 s; processes in it: $(find "$hierarchy" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
    fi
  done
  # A bench's client cgroup (as_remote_client) that its bench, killed, did not leave.
  rmdir /sys/fs/cgroup/cpu/"$CGROUP_ROOT"-client /sys/fs/cgroup/"$CGROUP_ROOT"-client 2>/dev/null || true
}

# cgroups_of_node0 HIERARCHY WORKERS: node 0's cgroups under the cluster's root HIERARCHY, deepest
# first: not the root, and not the cgroups of WORKERS (their names, space-separated), which are
# under it too.
cgroups_of_node0() {
  find "$1" -mindepth 1 -type d 2>/dev/null |
    awk -v root="$1" -v workers="$2" 'BEGIN { n = split(workers, w, " ") }
      { for (i = 1; i <= n; i++) { p = root "/" w[i]; if ($0 == p || index($0, p "/") == 1) next } print }' |
    sort -r
}

# The cluster's processes: those of its network namespace in another pid namespace than this
# shell's (the cluster's own, or a container's in it). The scenarios, which call restart-node,
# run in the cluster's network namespace too, but in the host's pid namespace.
cluster_pids() {
  local pid self; self=$(readlink /proc/self/ns/pid)
  for pid in $(ip netns pids $NETNS); do
    [ "$(readlink /proc/$pid/ns/pid 2>/dev/null)" = "$self" ] || [ ! -e /proc/$pid ] || echo $pid
  done
}
cluster_gone() { [ -z "$(cluster_pids)" ]; }


kubelet_pids() { pgrep -f -x "$(kubelet_command 0)"; }
kubelet_healthz() { [ "$(innet curl -s http://127.0.0.1:10248/healthz)" = ok ]; }

# --- down ------------------------------------------------------------------------------------

# cluster_files: the inode of every file under the scratch dir, one a line.
cluster_files() { find "$D" -xdev -type f -printf '%i\n' 2>/dev/null; }

# loop_devices_of FILES: the loop devices backed by one of FILES (inodes, as cluster_files gives
# them, of the scratch dir's filesystem). Matched by device and inode: the path the kernel shows
# is relative to the mount a node's mount namespace opened it through ("/loop-images/x.img"),
# not the host's.
loop_devices_of() {
  local fs; fs=$(stat -c '%Hd:%Ld' "$D")
  losetup --list --noheadings --output NAME,BACK-MAJ:MIN,BACK-INO 2>/dev/null |
    awk -v fs="$fs" 'NR == FNR { file[$1] = 1; next } $2 == fs && ($3 in file) { print $1 }' <(printf '%s\n' "$1") -
}

# mount_point_anywhere DIR: DIR (letters, digits, . _ - /) is a mount point in some process's
# view: its mount namespace's, or its container's under its own root (either way the dir is kept
# rather than risked). grep -q, as no pipe: a vanished process's file is no error then.
mount_point_anywhere() {
  # ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS...
  grep -qsE "^[0-9]+ [0-9]+ [0-9]+:[0-9]+ [^ ]+ ${1//./\\.} " /proc/[0-9]*/mountinfo
}

# The workers whose network namespace exists, whatever E2E_NODES says now.
worker_netns_made() {
  ip netns list 2>/dev/null | awk -v p="$NETNS-w" 'index($1, p) == 1 && substr($1, length(p) + 1) ~ /^[0-9]+$/ { print substr($1, length(p) + 1) }'
}

# stop_worker I: every process of worker I killed (its init, the pid namespace's every process
# with it: containerd, kubelet, the containers) and its network namespace's; its mounts, which
# only its mount namespace had, go with the namespace.
stop_worker() {
  local i=$1 dir ns pid
  dir=$(node_dir $i) ns=$(node_netns $i)
  if [ -e /run/netns/$ns ]; then
    # Its init among them: the pause in its pid namespace, which entered its network namespace.
    for pid in $(ip netns pids $ns 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    wait_for 30 "the processes of netns $ns to end" sh -c "[ -z \"\$(ip netns pids $ns)\" ]" || true
  fi
  if [ -f "$dir/run/init.pid" ]; then
    pid=$(cat "$dir/run/init.pid")
    wait_for 30 "node $(node_name $i)'s init to end" sh -c "[ ! -d /proc/$pid ]" || true
    rm -f "$dir/run/init.pid"
  fi
  if [ -f "$dir/run/unshare.pid" ]; then
    pid=$(cat "$dir/run/unshare.pid")
    # unshare ends with its child; only if it is still the one this node started.
    if grep -qs -- "--uts" "/proc/$pid/cmdline" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$dir/run/unshare.pid"
  fi
}

down() {
  log "down: stopping the cluster in $D"
  # The workers first (they are clients of node 0's control plane), every one up made.
  local w
  for w in $( (workers_made; worker_netns_made) | sort -nu); do
    log "down: worker $(node_name $w)"
    stop_worker $w
    if [ -e /run/netns/$(node_netns $w) ]; then ip netns del $(node_netns $w); fi
  done
  # Every process of the cluster is in the pid namespace of init: killing init kills them all.
  log "down: node $(node_name 0)"
  if [ -f "$D/run/init.pid" ]; then
    local init; init=$(cat "$D/run/init.pid")
    if [ -d "/proc/$init" ]; then kill -KILL "$init" 2>/dev/null || true; fi
  fi
  if [ -f "$D/run/unshare.pid" ]; then
    kill -KILL "$(cat "$D/run/unshare.pid")" 2>/dev/null || true
  fi
  # Anything else still in the network namespace (a run killed before it wrote init.pid).
  if [ -e /run/netns/$NETNS ]; then
    local pid
    for pid in $(ip netns pids $NETNS 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    wait_for 30 "the processes of netns $NETNS to end" sh -c "[ -z \"\$(ip netns pids $NETNS)\" ]" || true
  fi
  # Mounts under the scratch dir, deepest first (kubelet's dir, containers' rootfs, the dir itself).
  if [ -d "$D" ]; then
    local round mounts
    mounts=$(findmnt -rn -o TARGET | awk -v d="$D" '$0 == d || index($0, d "/") == 1' | sort -r)
    log "down: $(grep -c . <<<"$mounts") mounts under $D"
    for round in 1 2 3 4 5; do
      [ -n "$mounts" ] || break
      while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done <<<"$mounts"
      mounts=$(findmnt -rn -o TARGET | awk -v d="$D" '$0 == d || index($0, d "/") == 1' | sort -r)
    done
    mounts=$(findmnt -rn -o TARGET | awk -v d="$D" '$0 == d || index($0, d "/") == 1')
    [ -z "$mounts" ] || die "still mounted, not removing $D: $mounts"
  fi
  # Loop devices are the kernel's, not the cluster's namespaces': one still backed by an image
  # under the scratch dir (a node's unmountdevice that never ran) outlives every process.
  # The files are listed once, now: once they are removed nothing under the scratch dir names
  # them. A device still busy is freed by the kernel once its last user goes: seconds at most.
  local device files loop_left=
  if [ -d "$D" ]; then
    files=$(cluster_files)
    for device in $(loop_devices_of "$files"); do
      log "down: detaching $device, left behind by the cluster"
      losetup -d "$device" 2>/dev/null || true
    done
    for _ in $(seq 20); do
      loop_left=$(loop_devices_of "$files" | tr '\n' ' ')
      [ -n "$loop_left" ] || break
      sleep 0.5
    done
  fi
  # cgroups kubelet and runc made (kubelet's cgroupRoot), in every hierarchy, deepest first.
  log "down: cgroups"
  remove_cgroups
  if [ -e /run/netns/$NETNS ]; then ip netns del $NETNS; fi
  if [ -f "$D/run/made-run-netns-mount" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null || true
  fi
  if [ -f "$D/run/made-run-netns" ]; then rmdir /run/netns 2>/dev/null || true; fi
  # Not while another run's cluster (another netns) may have its tmpfs on it: removing a dir
  # that is a mount point in another mount namespace detaches that mount there.
  if [ -f "$D/run/made-run-containerd" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    rmdir /run/containerd 2>/dev/null || true
  fi
  # The dirs up made for E2E_PLUGIN_DIR, deepest first, each only while empty (a parent is not,
  # once a child stays). Every node's mount there went with its namespace; a mount there that
  # some process still sees (another run's node, given the same E2E_PLUGIN_DIR) keeps the dir,
  # and the dirs above it, with a warning: removing a dir that is a mount point in another mount
  # namespace detaches that mount there.
  local made_dir made_left=() kept='' deadline
  if [ -f "$D/run/made-plugin-dirs" ]; then
    while read -r made_dir; do
      [ -e "$made_dir" ] || continue
      [[ -z $kept || $kept != "$made_dir"/* ]] || continue
      # A node's unshare, in its mount namespace too, may still be ending (down kills it last).
      deadline=$((SECONDS + 10))
      while mount_point_anywhere "$made_dir" && ((SECONDS < deadline)); do sleep 0.5; done
      if mount_point_anywhere "$made_dir"; then
        log "WARNING: $made_dir (and the dirs above it that up made) kept: another mount namespace (another run's?) has a mount there"
        kept=$made_dir
        continue
      fi
      rmdir "$made_dir" 2>/dev/null || made_left+=("$made_dir")
    done < <(tac "$D/run/made-plugin-dirs")
  fi
  log "down: removing $D"
  rm -rf --one-file-system "$D"
  # Nothing left: no process started from the scratch dir, no netns, no cgroup, no loop device
  # backed by its files, no dir (nor one made for E2E_PLUGIN_DIR).
  local left=()
  ((${#made_left[@]} == 0)) || left+=("E2E_PLUGIN_DIR's dirs ${made_left[*]} (not empty)")
  [ ! -e "$D" ] || left+=("$D")
  [ -z "$loop_left" ] || left+=("loop devices $loop_left")
  [ ! -e /run/netns/$NETNS ] || left+=("netns $NETNS")
  [ -z "$(worker_netns_made)" ] || left+=("netns $(worker_netns_made | sed "s/^/$NETNS-w/" | tr '\n' ' ')")
  ! pgrep -f "$D/" >/dev/null || left+=("processes $(pgrep -f "$D/" | tr '\n' ' ')")
  for hierarchy in /sys/fs/cgroup/*/"$CGROUP_ROOT" /sys/fs/cgroup/"$CGROUP_ROOT"; do
    [ ! -d "$hierarchy" ] || left+=("$hierarchy")
  done
  ((${#left[@]} == 0)) || die "down left ${left[*]}"
  log "down: done"
}

# --- build ---------------------------------------------------------------------------------

build() {
  mkdir -p "$D/bin"
  log "build: kube (tests/e2e/tools.sh kube; about 8 minutes cold on 2 cores, every tool about 18)"
  ln -sf "$("$here/tools.sh" kube)" "$D/bin/kube"
  if [ -n "${FLEXD:-}" ]; then
    cp "$FLEXD" "$D/bin/flexd"
  else
    log "build: flexd (cargo build --release -p flexd)"
    (cd "$repo" && cargo build --release -p flexd >&2)
    cp "$(cd "$repo" && cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/release/flexd" "$D/bin/flexd"
  fi
  if [ "$E2E_IMAGES" = dockerfile ]; then
    log "build: $FLEXD_IMAGE and $INSTALLER_IMAGE from deploy/Dockerfile (tests/e2e/images.sh; cached per machine)"
    "$here/images.sh" >/dev/null
  fi
  local tool
  local tools=("${SIDECARS[@]}")
  if storage_suite_wanted; then
    tools+=(storage-e2e ginkgo agnhost)
  else
    log "build: not Kubernetes' storage suite (no storage scenario in E2E_SCENARIOS)"
  fi
  for tool in "${tools[@]}"; do
    log "build: $tool (tests/e2e/tools.sh $tool; cached per machine)"
    ln -sf "$("$here/tools.sh" $tool)" "$D/bin/$tool"
  done
  # Ginkgo's CLI runs a compiled suite by its .test name.
  ! storage_suite_wanted || ln -sf "$D/bin/storage-e2e" "$D/bin/storage-e2e.test"
  log "build: the scenarios (tests/e2e/scenarios, a Go test binary)"
  local goflags
  goflags=$("$here/tools.sh" goflags)
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="$goflags" PATH=$PATH:/usr/local/go/bin go test -c -o "$D/bin/scenarios.test" ./scenarios)
  log "build: pause, recorder"
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="$goflags" PATH=$PATH:/usr/local/go/bin go build -o "$D/bin/pause" ./cmd/pause)
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="$goflags" PATH=$PATH:/usr/local/go/bin go build -o "$D/bin/recorder" ./cmd/recorder)
}

# --- images --------------------------------------------------------------------------------

# copy_libs ROOTFS FILE...: the shared libraries the files load (and the loader), at their paths.
copy_libs() {
  local rootfs=$1 lib; shift
  for lib in $(ldd "$@" 2>/dev/null | grep -o '/[^ :]*' | sort -u); do
    [ -e "$lib" ] && [ ! -e "$rootfs$lib" ] && cp -L --parents "$lib" "$rootfs"
  done
  return 0
}

# copy_with_libs ROOTFS FILE...: host files at their paths, with their libraries.
copy_with_libs() {
  local rootfs=$1 file; shift
  for file in "$@"; do
    mkdir -p "$rootfs$(dirname "$file")"
    cp -L "$file" "$rootfs$file"
  done
  copy_libs "$rootfs" "$@"
}

# image NAME:TAG POPULATE ENTRYPOINT...: an OCI image built with umoci, imported into containerd.
image() {
  local ref=$1 populate=$2; shift 2
  local name=${ref%:*} tag=${ref##*:} work="$D/images/${ref//[\/:]/_}"
  mkdir -p "$work"
  umoci init --layout "$work/oci"
  umoci new --image "$work/oci:$tag"
  umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
  "$populate" "$work/bundle/rootfs"
  umoci repack --image "$work/oci:$tag" "$work/bundle"
  local entrypoint=() arg
  for arg in "$@"; do entrypoint+=(--config.entrypoint "$arg"); done
  for arg in "${IMAGE_ENV[@]}"; do entrypoint+=(--config.env "$arg"); done
  for arg in "${IMAGE_CMD[@]}"; do entrypoint+=(--config.cmd "$arg"); done
  umoci config --image "$work/oci:$tag" "${entrypoint[@]}"
  umoci gc --layout "$work/oci"
  import_image "$ref" "$work"
}

# image_built NAME:TAG: an image from buildah's storage (tests/e2e/images.sh), imported into
# containerd as it is.
image_built() {
  local ref=$1 tag=${1##*:} work="$D/images/${1//[\/:]/_}"
  mkdir -p "$work"
  skopeo copy --quiet "containers-storage:$ref" "oci:$work/oci:$tag"
  import_image "$ref" "$work"
}

# import_image NAME:TAG WORK: the OCI layout WORK/oci into every node's containerd (nothing is
# pulled, each node has what it runs); WORK removed. Into every node at once, each node having a
# containerd of its own: the imports are most of `up`.
import_image() {
  local ref=$1 work=$2 name=${1%:*}
  tar -C "$work/oci" -cf "$work/image.tar" .
  local i importing=()
  for i in $(node_indexes); do
    ctr_on $i images import --base-name "$name" "$work/image.tar" >/dev/null &
    importing[i]=$!
  done
  for i in $(node_indexes); do
    wait "${importing[i]}" || die "image $ref could not be imported into node $(node_name $i)'s containerd"
    ctr_on $i images ls -q | grep -x "$ref" >/dev/null || die "image $ref is not in node $(node_name $i)'s containerd after the import"
  done
  rm -rf --one-file-system "$work"
}

IMAGE_ENV=() # KEY=VALUE environment of the next image()
IMAGE_CMD=() # default arguments (CMD) of the next image()

populate_pause() { install -D -m 0755 "$D/bin/pause" "$1/pause"; }

# The equivalent of deploy/Dockerfile's flexd target (debian:bookworm-slim with e2fsprogs,
# xfsprogs, util-linux and mount, flexd in /usr/local/bin), from the same binary and this
# Debian host's tools: what flexd runs itself (mount, umount, blkid, mkfs.*, resize2fs,
# xfs_growfs), /bin/sh, and their libraries.
populate_flexd() {
  local rootfs=$1 tool tools=() dir
  # Merged /usr, as in Debian 12: /bin, /sbin and /lib* are links into /usr.
  for dir in bin sbin lib lib64; do mkdir -p "$rootfs/usr/$dir" && ln -s "usr/$dir" "$rootfs/$dir"; done
  install -D -m 0755 "$D/bin/flexd" "$rootfs/usr/local/bin/flexd"
  copy_libs "$rootfs" "$D/bin/flexd"
  for tool in sh mount umount blkid findmnt losetup mkfs.ext4 mke2fs e2fsck resize2fs mkfs.xfs xfs_growfs xfs_repair; do
    tool=$(command -v $tool || true)
    [ -z "$tool" ] || tools+=("$tool")
  done
  copy_with_libs "$rootfs" "${tools[@]}"
  mkdir -p "$rootfs/tmp" "$rootfs/etc"
  chmod 1777 "$rootfs/tmp"
}

# The scenarios' pods: a static busybox.
populate_tools() {
  install -D -m 0755 "$(command -v busybox)" "$1/bin/busybox"
  chroot "$1" /bin/busybox --install -s /bin
  mkdir -p "$1/tmp" "$1/etc"
}

# Kubernetes' glibc-dns-testing image is Debian with dnsutils: here, this Debian host's shell and
# core tools (what the storage specs run in it), with their libraries.
populate_glibc() {
  local rootfs=$1 dir files
  for dir in bin sbin lib lib64; do mkdir -p "$rootfs/usr/$dir" && ln -s "usr/$dir" "$rootfs/$dir"; done
  files=$(dpkg -L dash coreutils grep sed findutils mawk util-linux 2>/dev/null |
    grep -E '^/(usr/)?s?bin/[^/]+$' | while read -r f; do [ -f "$f" ] && [ -x "$f" ] && echo "$f"; done)
  # shellcheck disable=SC2086
  copy_with_libs "$rootfs" $files
  mkdir -p "$rootfs/tmp" "$rootfs/etc"
  chmod 1777 "$rootfs/tmp"
}

# Kubernetes' agnhost image (Alpine with /agnhost, entrypoint /agnhost, CMD pause): here the
# agnhost built from the pinned Kubernetes, on the busybox userland.
populate_agnhost() {
  populate_tools "$1"
  install -D -m 0755 "$D/bin/agnhost" "$1/agnhost"
}

# A CSI sidecar: its static binary, alone.
populate_sidecar() {
  install -D -m 0755 "$D/bin/$SIDECAR" "$1/$SIDECAR"
  mkdir -p "$1/tmp"
  chmod 1777 "$1/tmp"
}

# deploy/Dockerfile's installer target: flexd and one driver (/driver), its entrypoint /bin/sh.
populate_installer() {
  local rootfs=$1 dir
  for dir in bin sbin lib lib64; do mkdir -p "$rootfs/usr/$dir" && ln -s "usr/$dir" "$rootfs/$dir"; done
  install -D -m 0755 "$D/bin/flexd" "$rootfs/usr/local/bin/flexd"
  copy_libs "$rootfs" "$D/bin/flexd"
  copy_with_libs "$rootfs" "$(command -v sh)"
  install -m 0755 "$D/run/late" "$rootfs/driver"
  mkdir -p "$rootfs/tmp" "$rootfs/etc"
  chmod 1777 "$rootfs/tmp"
}

# --- up ------------------------------------------------------------------------------------

certificates() {
  local pki=$D/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 7 \
    -subj /CN=flexd-e2e-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" \
    -subj /CN=kube-apiserver 2>/dev/null
  printf 'subjectAltName=IP:%s,IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' \
    "$NODE_IP" >"$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -out "$pki/apiserver.crt" -days 7 -extfile "$pki/apiserver.ext" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  # One static admin token: the control plane, kubelet and the scenarios use it.
  echo "$TOKEN,admin,admin,system:masters" >"$pki/tokens.csv"
  cat >"$D/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$pki/ca.crt"}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
EOF
}

# start NAME COMMAND...: a daemon in the cluster's namespaces, its log in $D/logs/NAME.log.
start() {
  local name=$1; shift
  in_service_cgroup 0 "$name"
  incluster setsid "${IN_SERVICE_CGROUP[@]}" "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
}

# start_on I NAME COMMAND...: a daemon in node I's namespaces, its log node_log I NAME.
start_on() {
  local i=$1 name=$2; shift 2
  in_service_cgroup $i "$name"
  innode $i setsid "${IN_SERVICE_CGROUP[@]}" "$@" >"$(node_log $i $name)" 2>&1 </dev/null &
}

# in_service_cgroup I NAME: IN_SERVICE_CGROUP, the words that start a daemon of node I in a CPU
# cgroup of its own,
# <node's cgroup root>/system.slice/NAME.service, as systemd runs kubelet and containerd on a node.
# In the host's root cgroup every one of their threads, and every FlexVolume driver kubelet runs,
# would weigh as much as the whole of kubepods, where flexd and its drivers run
# (bench/pod-startup.sh measured kubelet's drivers 5x faster than flexd's for it).
in_service_cgroup() {
  IN_SERVICE_CGROUP=()
  local hierarchy=/sys/fs/cgroup/cpu
  [ -d $hierarchy ] || hierarchy=/sys/fs/cgroup
  [ -e $hierarchy/cgroup.procs ] || return 0
  local cgroup=$hierarchy/$(node_cgroup_root $1)/system.slice/$2.service
  mkdir -p "$cgroup"
  # shellcheck disable=SC2016 # expanded by that shell
  IN_SERVICE_CGROUP=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cgroup")
}

# as_remote_client: this shell, and what it starts from now on, in a CPU cgroup of the least
# weight, $CGROUP_ROOT-client beside the cluster's (left by leave_client_cgroup). For the
# benches (bench/): their clients (kubectl, the scenarios binary) stand for ones that run off the
# node, yet here they share its two cores, and in the host's root cgroup each of their
# processes weighs as much as the whole cluster. 50 `kubectl apply` at once made kubelet's and
# flexd's MountVolume 5-10x slower than with the clients out of the way (bench/pod-startup.sh).
# Best effort: without a cgroup to make, the clients stay where they are.
as_remote_client() {
  local hierarchy=/sys/fs/cgroup/cpu weight=cpu.shares least=2
  if [ ! -d $hierarchy ]; then
    hierarchy=/sys/fs/cgroup weight=cpu.weight least=1
    grep -qw cpu $hierarchy/cgroup.subtree_control 2>/dev/null || return 0
  fi
  local cgroup=$hierarchy/$CGROUP_ROOT-client
  mkdir -p "$cgroup" 2>/dev/null && echo $least >"$cgroup/$weight" && echo $$ >"$cgroup/cgroup.procs" ||
    log "WARNING: the bench's clients share the cluster's CPU at full weight (no $cgroup)"
}

# leave_client_cgroup: back from as_remote_client, once the clients it started have ended.
leave_client_cgroup() {
  local cgroup
  for cgroup in /sys/fs/cgroup/cpu/"$CGROUP_ROOT"-client /sys/fs/cgroup/"$CGROUP_ROOT"-client; do
    [ -d "$cgroup" ] || continue
    echo $$ >"$(dirname "$cgroup")/cgroup.procs" 2>/dev/null || true
    rmdir "$cgroup" 2>/dev/null || log "WARNING: $cgroup still holds a process; left"
  done
}

apiserver_ready() {
  innet curl -fsS --cacert "$D/pki/ca.crt" -H "Authorization: Bearer $TOKEN" "https://$NODE_IP:6443/readyz"
}

# node_ready [NAME]: the node (node 0 by default) is Ready.
node_ready() {
  [ "$(kubectl get node "${1:-$NODE}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# init_ready UNSHARE_PID PIDFILE: unshare's child is pause (so it has mounted /proc and entered
# its network namespace) and its pid is in PIDFILE. Found any earlier, nsenter would join
# namespaces half made: the host's network among them.
init_ready() {
  local child
  child=$(pgrep -P "$1") || return 1
  [ "$(readlink "/proc/$child/exe")" = "$(readlink -f "$D/bin/pause")" ] || return 1
  echo "$child" >"$2"
}

# make_plugin_dir: the dirs of E2E_PLUGIN_DIR the host lacks, made (empty: mount points), each
# recorded in $D/run/made-plugin-dirs as soon as it is made, shallowest first, so that `down`
# removes those and no other, even after an `up` stopped half way.
make_plugin_dir() {
  [ "$PLUGIN_DIR" != "$D/plugins" ] || return 0
  local dir='' part parts
  IFS=/ read -r -a parts <<<"${PLUGIN_DIR#/}"
  for part in "${parts[@]}"; do
    dir+=/$part
    [ ! -d "$dir" ] || continue
    if [ -e "$dir" ] || [ -L "$dir" ]; then die "E2E_PLUGIN_DIR=$PLUGIN_DIR: $dir is there and is not a directory"; fi
    mkdir "$dir"
    echo "$dir" >>"$D/run/made-plugin-dirs"
  done
}

# same_plugin_dir: the cluster in $D was brought up with this E2E_PLUGIN_DIR, or die: whatever
# starts its components again, or tests them, gives them the same.
same_plugin_dir() {
  local recorded; recorded=$(cat "$D/run/plugin-dir" 2>/dev/null) || recorded="nothing recorded"
  [ "$recorded" = "$PLUGIN_DIR" ] || die "the cluster in $D has the plugin dir $recorded, E2E_PLUGIN_DIR says $PLUGIN_DIR"
}

# mount_plugin_dir I: with E2E_PLUGIN_DIR, node I's own plugin dir (<node dir>/plugins, where the
# host installs drivers and the scenarios look) bind-mounted at E2E_PLUGIN_DIR in node I's mount
# namespace, where its kubelet, kube-controller-manager and containerd (the pods' hostPath
# volumes) look; in no other: a node sees its own drivers only, and the host's dir stays the
# empty one up found or made. Again at every boot of the node (restart-node, start-node): the
# mount goes with its namespace.
mount_plugin_dir() {
  local i=$1 before
  [ "$PLUGIN_DIR" != "$D/plugins" ] || return 0
  before=$(findmnt -rn -o TARGET | grep -cxF "$PLUGIN_DIR" || true)
  # The mount holding the mount point is the host's, copied (propagation unchanged): where the
  # host shares it (a systemd host's /), its copy here is the host's peer and would pass the new
  # mount on to it. As a slave it still gets the host's mounts and gives none back.
  # shellcheck disable=SC2016 # expanded by that shell
  innode "$i" sh -euc '
    source=$1 target=$2
    parent=$(findmnt -n -o TARGET -T "$target")
    case $(findmnt -n -o PROPAGATION "$parent") in *shared*) mount --make-slave "$parent" ;; esac
    mount --bind "$source" "$target"' sh "$(node_dir "$i")/plugins" "$PLUGIN_DIR"
  [ "$(findmnt -rn -o TARGET | grep -cxF "$PLUGIN_DIR" || true)" = "$before" ] ||
    die "node $(node_name "$i")'s mount at $PLUGIN_DIR (E2E_PLUGIN_DIR) propagated to the host"
}

# The cluster's processes, started by `up` and again by the node-restart scenario (a node's boot:
# the disk as it was, no process, no mount of the pods, no cgroup).
start_init() {
  log "up: pid and mount namespaces, init = pause"
  setsid unshare --pid --fork --kill-child --mount --propagation unchanged --mount-proc \
    nsenter --net=/run/netns/$NETNS "$D/bin/pause" \
    >"$D/logs/init.log" 2>&1 </dev/null &
  echo $! >"$D/run/unshare.pid"
  wait_for 10 "the cluster's init" init_ready "$(cat "$D/run/unshare.pid")" "$D/run/init.pid"

  # containerd 1.6 keeps its shims' sockets, fifos and runc state in /run/containerd whatever
  # its state dir: a tmpfs there, in the cluster's mount namespace only (/ is not shared).
  if [ ! -e /run/containerd ]; then
    mkdir /run/containerd && touch "$D/run/made-run-containerd"
  fi
  incluster mount -t tmpfs -o mode=0711 "$E2E_NAME-containerd" /run/containerd
  # kubelet writes the containers' logs in /var/log/pods and links them from /var/log/containers
  # (a fixed path): the cluster's /var/log is $D/var-log, on disk as a node's (a node restart
  # keeps it), so nothing is left on the host's /var/log.
  mkdir -p "$D/var-log"
  touch "$D/var-log/.$E2E_NAME"
  incluster mount --bind "$D/var-log" /var/log
  [ ! -e "/var/log/.$E2E_NAME" ] || die "the cluster's /var/log propagated to the host's"
  mount_plugin_dir 0

  for hierarchy in /sys/fs/cgroup/*/; do
    [ "$hierarchy" = /sys/fs/cgroup/unified/ ] || mkdir -p "$hierarchy$CGROUP_ROOT"
  done
  weigh_cluster_cgroup
}

# weigh_cluster_cgroup: the cluster's CPU cgroup weighs as much as its nodes would, one default
# weight each. It stands for E2E_NODES machines, yet all of it shares one cgroup of the host: at
# the default weight, on a host busy with other work (a build, another job's session: each its
# own group of the scheduler), three nodes' kubelets, control plane and pods together got as
# much CPU as one busy loop beside them.
# Best effort, as the cluster runs without it.
weigh_cluster_cgroup() {
  local cgroup=/sys/fs/cgroup/cpu/$CGROUP_ROOT weight=cpu.shares default=1024
  if [ ! -d "$cgroup" ]; then
    cgroup=/sys/fs/cgroup/$CGROUP_ROOT weight=cpu.weight default=100
  fi
  [ -e "$cgroup/$weight" ] || return 0
  echo $((E2E_NODES * default)) >"$cgroup/$weight" 2>/dev/null ||
    log "WARNING: the cluster's CPU cgroup keeps the default weight (could not write $cgroup/$weight)"
}

start_control_plane() {
  log "up: etcd"
  start etcd "$D/bin/kube" etcd --name e2e --data-dir "$D/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster e2e=http://127.0.0.1:2380 --log-level warn

  log "up: kube-apiserver"
  start kube-apiserver "$D/bin/kube" kube-apiserver \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=6443 \
    --advertise-address=$NODE_IP --endpoint-reconciler-type=none \
    --kubelet-preferred-address-types=InternalIP \
    --tls-cert-file="$D/pki/apiserver.crt" --tls-private-key-file="$D/pki/apiserver.key" \
    --cert-dir="$D/pki/apiserver" --token-auth-file="$D/pki/tokens.csv" \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --service-cluster-ip-range=10.0.0.0/24 \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$D/pki/sa.pub" --service-account-signing-key-file="$D/pki/sa.key"
  wait_for 180 "kube-apiserver /readyz" apiserver_ready

  log "up: kube-controller-manager, kube-scheduler"
  start kube-controller-manager "$D/bin/kube" kube-controller-manager \
    --kubeconfig="$D/kubeconfig" --leader-elect=false --bind-address=127.0.0.1 \
    --cert-dir="$D/pki/controller-manager" \
    --service-account-private-key-file="$D/pki/sa.key" --root-ca-file="$D/pki/ca.crt" \
    --flex-volume-plugin-dir="$PLUGIN_DIR" \
    ${E2E_KCM_API_QPS:+--kube-api-qps="$E2E_KCM_API_QPS" --kube-api-burst=$((2 * E2E_KCM_API_QPS))}
  start kube-scheduler "$D/bin/kube" kube-scheduler \
    --kubeconfig="$D/kubeconfig" --leader-elect=false --bind-address=127.0.0.1
}

# start_containerd [I]: node I's containerd (node 0's by default).
start_containerd() {
  local i=${1:-0}
  start_on $i containerd containerd --config "$(node_dir $i)/containerd/config.toml"
  wait_for 60 "containerd of $(node_name $i)" ctr_on $i version
}

# kubelet_command I: node I's kubelet. Its root dir is $D/kubelet on every node (a worker's own
# dir is mounted there in its mount namespace); its config and serving certificate are its own.
kubelet_command() {
  local dir; dir=$(node_dir $1)
  echo "$D/bin/kube" kubelet --config="$dir/kubelet.yaml" --kubeconfig="$D/kubeconfig" \
    --root-dir="$D/kubelet" --cert-dir="$dir/pki/kubelet" \
    --hostname-override=$(node_name $1) --node-ip=$(node_ip $1)
}

# start_kubelet [I]: node I's kubelet (node 0's by default).
start_kubelet() {
  local i=${1:-0}
  # Appended: a restarted kubelet's log follows the first one's.
  in_service_cgroup $i kubelet
  innode $i setsid "${IN_SERVICE_CGROUP[@]}" $(kubelet_command $i) >>"$(node_log $i kubelet)" 2>&1 </dev/null &
}

# service_nat NETNS: what kube-proxy would do for the API server's Service (default/kubernetes,
# the first address of the service range, port 443) in a node's network namespace: the sidecars
# reach the API server by their in-cluster config. The cluster has no kube-proxy; this is the one
# Service its pods use.
service_nat() {
  nsenter --net=/run/netns/$1 nft -f - <<EOF
table ip e2e-services {
  chain prerouting { type nat hook prerouting priority dstnat; ip daddr $API_SERVICE_IP tcp dport 443 dnat to $NODE_IP:6443; }
  chain output { type nat hook output priority -100; ip daddr $API_SERVICE_IP tcp dport 443 dnat to $NODE_IP:6443; }
}
EOF
}

# nodes_network: with workers, node 0's address is on a bridge in its network namespace, and each
# worker's network namespace has a veth on it, its address in the same /24; every node routes the
# others' pod subnets to them. The bridge has no other port: nothing leads out.
nodes_network() {
  local i j ns
  ip -n $NETNS link add $NODES_BRIDGE type bridge
  ip -n $NETNS addr add $NODE_IP/24 dev $NODES_BRIDGE
  ip -n $NETNS link set $NODES_BRIDGE up
  for i in $(worker_indexes); do
    ns=$(node_netns $i)
    ip netns add $ns
    ip -n $ns link set lo up
    ip -n $NETNS link add name e2e-w$i type veth peer name eth0 netns $ns
    ip -n $NETNS link set e2e-w$i master $NODES_BRIDGE up
    ip -n $ns addr add "$(node_ip $i)/24" dev eth0
    ip -n $ns link set eth0 up
    service_nat $ns
  done
  # Pod to pod across nodes: each node's netns routes (forwards) between its pods' bridge and
  # the nodes' bridge.
  for i in $(node_indexes); do
    nsenter --net=/run/netns/$(node_netns $i) sysctl -qw net.ipv4.ip_forward=1
    for j in $(node_indexes); do
      ((i == j)) || ip -n $(node_netns $i) route add "$(node_subnet $j)" via "$(node_ip $j)"
    done
  done
}

# start_worker_init I: worker I's pid, mount and uts namespaces, as start_init node 0's, and its
# own mounts in them: $D a slave of the host's (the host's mounts reach it, its own never leave
# it), its hostname, its /run/containerd and /var/log, its kubelet, plugin and flexd state dirs
# over node 0's paths, shared again (for the Bidirectional mounts of flexd's node pod), and its
# plugin dir at E2E_PLUGIN_DIR too (mount_plugin_dir).
start_worker_init() {
  local i=$1 dir name hierarchy
  dir=$(node_dir $i) name=$(node_name $i)
  log "up: node $name: pid, mount and uts namespaces, init = pause"
  setsid unshare --pid --fork --kill-child --mount --uts --propagation unchanged --mount-proc \
    nsenter --net=/run/netns/$(node_netns $i) "$D/bin/pause" \
    >"$(node_log $i init)" 2>&1 </dev/null &
  echo $! >"$dir/run/unshare.pid"
  wait_for 10 "node $name's init" init_ready "$(cat "$dir/run/unshare.pid")" "$dir/run/init.pid"
  touch "$dir/var-log/.$E2E_NAME-$name"
  innode $i sh -euc '
    D=$1 dir=$2 name=$3 tmpfs=$4
    mount --make-rslave "$D"
    hostname "$name"
    mount -t tmpfs -o mode=0711 "$tmpfs" /run/containerd
    mount --bind "$dir/var-log" /var/log
    for sub in kubelet plugins flexd-state; do
      mount --bind "$dir/$sub" "$D/$sub"
      mount --make-shared "$D/$sub"
    done' sh "$D" "$dir" "$name" "$E2E_NAME-$name-containerd"
  [ ! -e "/var/log/.$E2E_NAME-$name" ] || die "node $name's /var/log propagated to the host's"
  [ "$(findmnt -rn -o TARGET | grep -c "^$D/kubelet\$")" = 0 ] || die "node $name's mounts propagated to the host"
  mount_plugin_dir "$i"
  for hierarchy in /sys/fs/cgroup/*/; do
    [ "$hierarchy" = /sys/fs/cgroup/unified/ ] || mkdir -p "$hierarchy$(node_cgroup_root $i)"
  done
}

# containerd_config I: node I's containerd config and CNI config (pods on the node's subnet, on
# a bridge in its network namespace).
containerd_config() {
  local i=$1 dir; dir=$(node_dir $i)
  mkdir -p "$dir/cni/net.d" "$dir/containerd"
  cat >"$dir/cni/net.d/10-bridge.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "e2e-pods", "plugins": [{"type": "bridge", "bridge": "e2e-pods",
  "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
  "ranges": [[{"subnet": "$(node_subnet $i)"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  netns_mounts_under_state_dir = true
  # Sandboxes get oom_score_adj -998, which needs CAP_SYS_RESOURCE; a host without it (this
  # one: a VM whose root lacks it) fails every sandbox in runc ("can't get final child's PID
  # from pipe: EOF"). Restricted, no score goes below containerd's own.
  restrict_oom_score_adj = $(grep -q '^CapBnd:.*' /proc/self/status && [ $(( 0x$(awk '/^CapBnd/ {print $2}' /proc/self/status) >> 24 & 1 )) = 0 ] && echo true || echo false)
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
}

# kubelet_config I: node I's kubelet config.
kubelet_config() {
  local i=$1 dir; dir=$(node_dir $i)
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip $i)
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$(node_cgroup_root $i)
failCgroupV1: false
failSwapOn: false
volumePluginDir: $PLUGIN_DIR
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
EOF
}

up() {
  preflight
  down
  rm -rf "$D.logs"
  local started=$SECONDS i
  build
  disk_room
  mkdir -p "$D"/{logs,run,etcd,plugins,flexd-state,kubelet,volumes,cni/net.d,containerd}
  echo "$E2E_NODES" >"$D/run/nodes"
  echo "$PLUGIN_DIR" >"$D/run/plugin-dir"
  make_plugin_dir
  for i in $(worker_indexes); do
    mkdir -p "$(node_dir $i)"/{run,plugins,flexd-state,kubelet,var-log,pki}
  done
  # A shared mount: kubelet and the flexd pod's Bidirectional mounts propagate through it.
  mount --bind "$D" "$D"
  mount --make-rshared "$D"

  log "up: network namespace $NETNS ($NODE_IP; nothing leads out)"
  # `ip netns add` makes /run/netns a mount (and the dir) when it is not one: down undoes that.
  [ -d /run/netns ] || touch "$D/run/made-run-netns"
  mountpoint -q /run/netns 2>/dev/null || touch "$D/run/made-run-netns-mount"
  ip netns add $NETNS
  ip -n $NETNS link set lo up
  service_nat $NETNS
  if ((E2E_NODES > 1)); then
    log "up: the workers' network namespaces on the bridge $NODES_BRIDGE ($NODE_IP/24)"
    nodes_network
  # The node's address on a dummy interface where the kernel has one, else on lo: either way
  # it is local to this namespace, which has no other interface.
  elif ip -n $NETNS link add e2e0 type dummy 2>/dev/null; then
    ip -n $NETNS addr add $NODE_IP/32 dev e2e0
    ip -n $NETNS link set e2e0 up
  else
    ip -n $NETNS addr add $NODE_IP/32 dev lo
  fi

  start_init
  certificates
  start_control_plane
  log "up: containerd"
  # Pods that are not hostNetwork (the controller Deployment, the storage suite's pods) get an
  # address on a bridge inside their node's netns: probes reach them, they reach the nodes'
  # addresses and the other nodes' pods, and nothing leads further.
  containerd_config 0
  start_containerd 0
  # The workers' namespaces are made before any pod runs on node 0: none of its mounts is
  # copied into theirs.
  for i in $(worker_indexes); do
    start_worker_init $i
    containerd_config $i
    start_containerd $i
  done

  log "up: images $PAUSE_IMAGE, $FLEXD_IMAGE, $TOOLS_IMAGE, ${SIDECARS[*]},$(storage_suite_wanted && echo " the storage suite's,") $INSTALLER_IMAGE"
  image "$PAUSE_IMAGE" populate_pause /pause
  if [ "$E2E_IMAGES" = dockerfile ]; then
    image_built "$FLEXD_IMAGE"
  else
    image "$FLEXD_IMAGE" populate_flexd /usr/local/bin/flexd
  fi
  image "$FLEXD_PREVIOUS_IMAGE" populate_flexd /usr/local/bin/flexd
  image "$TOOLS_IMAGE" populate_tools /bin/sh
  local sidecar
  for sidecar in "${SIDECARS[@]}"; do
    SIDECAR=$sidecar image "localhost/$sidecar:e2e" populate_sidecar "/$sidecar"
  done
  # The operator guide's example names its busybox itself (the newest suite's).
  local example; example=$(awk '$1 == "image:" {print $2; exit}' "$repo/examples/kubernetes/loop-app.yaml")
  image "$example" populate_tools /bin/sh
  if storage_suite_wanted; then
    # The suite's pods run Kubernetes' test images, by the names this Kubernetes gives them:
    # busybox (on an older minor another than the example's), and a Debian (glibc) userland for
    # the specs that ask for glibc-dns-testing (jessie-dnsutils before 1.36: storage-e2e
    # -print-images names it so either way).
    local images; images=$("$D/bin/storage-e2e" -print-images)
    local busybox; busybox=$(awk '$1 == "busybox" {print $2}' <<<"$images")
    [ "$example" = "$busybox" ] || image "$busybox" populate_tools /bin/sh
    image "$(awk '$1 == "glibc-dns-testing" {print $2}' <<<"$images")" populate_glibc /bin/sh
    # nginx's: the volumes suite's exec spec runs a shell script in it, never nginx itself.
    image "$(awk '$1 == "nginx" {print $2}' <<<"$images")" populate_tools /bin/sh
    IMAGE_CMD=(pause)
    image "$(awk '$1 == "agnhost" {print $2}' <<<"$images")" populate_agnhost /agnhost
    IMAGE_CMD=()
  fi
  # deploy/Dockerfile's installer target with the hostdir driver as e2e/late (the installer
  # scenario's driver, installed by the installer DaemonSet).
  sed "s|^ROOT=.*|ROOT=$D/volumes|" "$here/drivers/hostdir" >"$D/run/late"
  # The Dockerfile's installer holds the driver as it is in the repository, whose ROOT is the
  # default scratch dir's: another scratch dir gets the packed one.
  if [ "$E2E_IMAGES" = dockerfile ] && cmp -s "$D/run/late" "$here/drivers/hostdir"; then
    image_built "$INSTALLER_IMAGE"
  else
    IMAGE_ENV=(FLEXD_DRIVER=e2e/late)
    image "$INSTALLER_IMAGE" populate_installer /bin/sh -c \
      'exec /usr/local/bin/flexd --plugin-dir /flexmnt install --driver "$FLEXD_DRIVER" /driver --then-sleep'
    IMAGE_ENV=()
  fi

  log "up: the driver $DRIVER in every node's plugin dir"
  sed "s|^ROOT=.*|ROOT=$D/volumes|" "$here/drivers/hostdir" >"$D/run/hostdir"
  chmod 0755 "$D/run/hostdir"
  for i in $(node_indexes); do
    "$D/bin/flexd" --plugin-dir "$(node_dir $i)/plugins" install --driver "$DRIVER" "$D/run/hostdir" >&2
  done

  log "up: kubelet on $E2E_NODES node(s)"
  for i in $(node_indexes); do
    kubelet_config $i
    start_kubelet $i
  done
  for i in $(node_indexes); do
    wait_for 180 "node $(node_name $i) Ready" node_ready "$(node_name $i)"
  done
  wait_for 60 "the default service account" kubectl get serviceaccount default
  log "up: cluster ready in $((SECONDS - started))s"
  cat >"$D/env" <<EOF
export KUBECONFIG=$D/kubeconfig
# The API server is in the network namespace $NETNS: run kubectl there, e.g.
#   nsenter --net=/run/netns/$NETNS $D/bin/kube kubectl get nodes
EOF
  cat "$D/env"
}

# --- the node's own faults, for the scenarios --------------------------------------------

# kubelet killed (SIGKILL, as a crash) and started again; returns once it is healthy and the
# node Ready.
restart_kubelet() {
  local pids; pids=$(kubelet_pids) || die "no kubelet to kill"
  # shellcheck disable=SC2086
  kill -KILL $pids
  wait_for 30 "kubelet to end" sh -c "! pgrep -f -x '$(kubelet_command 0)'" || die "kubelet did not end"
  start_kubelet
  wait_for 120 "kubelet's /healthz" kubelet_healthz || die "kubelet is not healthy again"
  wait_for 120 "node $NODE Ready" node_ready || die "node $NODE is not Ready again"
}

# A node restart: every process of the cluster killed (containers too), every mount under the
# scratch dir gone (the pods' volumes, the containers' root filesystems), the cgroups gone; then
# everything started again as `up` does, until kubelet is healthy and the node Ready.
restart_node() {
  same_plugin_dir
  kill -KILL "$(cat "$D/run/init.pid")"
  wait_for 60 "every process of the cluster to end" cluster_gone || die "processes of the cluster survived: $(cluster_pids | tr '\n' ' ')"
  unmount_under "$D" || die "mounts under $D survived"
  [ -z "$(findmnt -rn -o TARGET | grep "^$D/kubelet/pods/")" ] || die "pod volumes still mounted"
  remove_cgroups node0
  log "node restart: starting again"
  start_init
  start_control_plane
  start_containerd
  start_kubelet
  wait_for 120 "kubelet's /healthz" kubelet_healthz || die "kubelet is not healthy again"
  wait_for 180 "node $NODE Ready" node_ready || die "node $NODE is not Ready again"
}

# --- a worker's loss, for the scenarios -------------------------------------------------------

# worker_index NAME: the index of the worker named NAME, or failure.
worker_index() {
  local w
  for w in $(workers_made); do
    if [ "$(node_name $w)" = "$1" ]; then echo $w; return 0; fi
  done
  return 1
}

# loop_devices_mounted_on I: the loop devices that are a mount's source in node I's mount
# namespace (a worker's: its init's view).
loop_devices_mounted_on() {
  local init; init=$(cat "$(node_dir $1)/run/init.pid" 2>/dev/null) || return 0
  # ID PARENT MAJ:MIN ROOT TARGET OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS
  sed -n 's|.* - [^ ]* \(/dev/loop[0-9]*\) .*|\1|p' "/proc/$init/mountinfo" 2>/dev/null | sort -u
}

# A worker lost (stop-node NAME): every process of the node killed, its containers too, and so
# its mount namespace and every mount in it gone; the node stays down (NotReady, then its pods
# evicted as Kubernetes decides) until start-node. What a lost machine would not leave: the loop
# devices its mounts used, which are the kernel's (every node's) and outlive the mounts, are
# detached, as the machine's would be with it; the cgroups its kubelet made are removed. Its
# network namespace and disk stay, for start-node.
stop_node() {
  local i device devices others=() j files
  i=$(worker_index "$1") || die "stop-node: no worker named $1 (node 0, $NODE, has the control plane: restart-node)"
  [ -f "$(node_dir $i)/run/init.pid" ] || die "stop-node: $1 is not running"
  devices=$(loop_devices_mounted_on $i)
  log "stop-node $1: every process killed; loop devices of its mounts: $(echo $devices)"
  stop_worker $i
  # Only devices backed by the cluster's files, and that no other node mounts.
  for j in $(workers_made); do ((j == i)) || others+=($(loop_devices_mounted_on $j)); done
  others+=($(findmnt -rn -o SOURCE | grep '^/dev/loop' || true))
  files=$(cluster_files)
  for device in $devices; do
    if ! loop_devices_of "$files" | grep -qx "$device"; then continue; fi
    if printf '%s\n' "${others[@]}" | grep -qx "$device"; then
      log "stop-node $1: $device is mounted on another node too: kept"
      continue
    fi
    # A device still mounted by the dying namespace is detached once its last mount goes.
    losetup -d "$device" 2>/dev/null || true
    wait_for 30 "$device to be detached" sh -c "! losetup --noheadings --output NAME --list | grep -qx '$device'" ||
      die "stop-node $1: $device is still attached"
  done
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/"$(node_cgroup_root $i)"; do
    [ -d "$hierarchy" ] || continue
    find "$hierarchy" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ ! -d "$hierarchy" ] || log "WARNING: cgroup $hierarchy could not be removed"
  done
  log "stop-node $1: down"
}

# start-node NAME: a worker stopped by stop-node booted again: its namespaces, containerd and
# kubelet as up made them, its disk as it was; returns once the node is Ready.
start_node() {
  local i
  i=$(worker_index "$1") || die "start-node: no worker named $1"
  same_plugin_dir
  [ ! -f "$(node_dir $i)/run/init.pid" ] || die "start-node: $1 is running (stop-node first)"
  start_worker_init $i
  start_containerd $i
  start_kubelet $i
  # The node may still be Ready in the API (its last status is not stale yet): kubelet's own
  # health first.
  wait_for 120 "kubelet's /healthz on $1" sh -c "[ \"\$(nsenter --net=/run/netns/$(node_netns $i) curl -s http://127.0.0.1:10248/healthz)\" = ok ]" ||
    die "kubelet of $1 is not healthy"
  wait_for 180 "node $1 Ready" node_ready "$1" || die "node $1 is not Ready again"
  log "start-node $1: Ready"
}

# Sourced (by run.sh, by the bench, or to call its functions by hand), it stops here.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
  up) up ;;
  down) [ "$(id -u)" = 0 ] || skip "not root"; down ;;
  restart-kubelet) restart_kubelet ;;
  restart-node) restart_node ;;
  stop-node) stop_node "${2:?stop-node NAME}" ;;
  start-node) start_node "${2:?start-node NAME}" ;;
  *) echo "usage: $0 up|down|restart-kubelet|restart-node|stop-node NAME|start-node NAME" >&2; exit 2 ;;
esac
