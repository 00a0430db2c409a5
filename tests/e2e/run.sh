#!/usr/bin/env bash
# flexd on a real single-node Kubernetes cluster (pinned in tests/e2e/go.mod), as root.
#
#   tests/e2e/run.sh up      build what is missing, start the cluster, print `export KUBECONFIG=...`
#   tests/e2e/run.sh down    stop and remove everything `up` made (idempotent)
#   tests/e2e/run.sh         up, every scenario, down (always); last line `N passed, M failed`
#   tests/e2e/run.sh test    the scenarios against a cluster that is up
#
# Environment: E2E_NAME (default flexd-e2e) names the network namespace, the cgroup root and the
# default scratch dir, so runs with different names coexist on one host; E2E_DIR (scratch dir,
# default /var/lib/$E2E_NAME: never a temporary dir, which flexd manifests refuses to deploy),
# FLEXD (a flexd binary to use
# instead of `cargo build --release -p flexd`), E2E_KEEP=1 (no `down` at the end, to look around),
# E2E_SCENARIOS (which scenarios, in order; default all). A failed run keeps its logs in
# $E2E_DIR.logs.
#
# Where it all runs. One network namespace, $E2E_NAME (default flexd-e2e), made here: `lo` and
# the node's address (10.77.0.1/32, on a dummy interface, or on lo where the kernel has no dummy), nothing that
# leads out. etcd, the control plane, containerd and kubelet run in it, and every pod is
# hostNetwork: nothing is sent to any address outside that namespace. They also run in a pid
# namespace of their own whose init is the pause binary (it reaps): a hostPID pod's /proc/1 is
# then that init, which flexd's --driver-mount-namespace=/proc/1/ns/mnt needs (the machine's own
# pid 1 may be unreadable), and `down` ends every process of the cluster, containers included,
# by killing that one init. The pid namespace needs its own /proc (runc reads /proc/<its pid>),
# so a mount namespace too, made from the host's with propagation unchanged: everything on disk
# is under E2E_DIR, a shared bind mount of itself, so every mount kubelet, containerd and the
# drivers make there is seen on the host (and Bidirectional propagation, which needs a shared
# mount, works). Under E2E_DIR: etcd, certificates, containerd's root and state, kubelet's root
# dir, the FlexVolume plugin dir, flexd's state dir, the volumes' data; cgroups are under
# /$E2E_NAME in every hierarchy (kubelet's cgroupRoot); /run/containerd is a tmpfs of the
# cluster's mount namespace.
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

log() { echo "[e2e $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
skip() { echo "E2E SKIPPED: $*"; echo "0 passed, 0 failed"; exit 0; }

# Commands in the cluster's network namespace; daemons also in its pid namespace.
innet() { nsenter --net=/run/netns/$NETNS "$@"; }
incluster() { nsenter --target "$(cat "$D/run/init.pid")" --pid --mount --net "$@"; }
kubectl() { innet "$D/bin/kube" kubectl --kubeconfig="$D/kubeconfig" "$@"; }
ctr() { command ctr --address "$D/containerd/containerd.sock" --namespace k8s.io "$@"; }

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
  [ -d /sys/fs/cgroup ] || skip "no /sys/fs/cgroup"
}

# --- down ------------------------------------------------------------------------------------

down() {
  log "down: stopping the cluster in $D"
  # Every process of the cluster is in the pid namespace of init: killing init kills them all.
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
    for round in 1 2 3 4 5; do
      mounts=$(findmnt -rn -o TARGET | awk -v d="$D" '$0 == d || index($0, d "/") == 1' | sort -r)
      [ -n "$mounts" ] || break
      while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done <<<"$mounts"
    done
    mounts=$(findmnt -rn -o TARGET | awk -v d="$D" '$0 == d || index($0, d "/") == 1')
    [ -z "$mounts" ] || die "still mounted, not removing $D: $mounts"
  fi
  # cgroups kubelet and runc made (kubelet's cgroupRoot), in every hierarchy, deepest first.
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
  rm -rf --one-file-system "$D"
  # Nothing left: no process started from the scratch dir, no netns, no cgroup, no dir.
  local left=()
  [ ! -e "$D" ] || left+=("$D")
  [ ! -e /run/netns/$NETNS ] || left+=("netns $NETNS")
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
  log "build: kube (tests/e2e/tools.sh kube; a cold build takes 20-40 minutes on 2 cores)"
  ln -sf "$("$here/tools.sh" kube)" "$D/bin/kube"
  if [ -n "${FLEXD:-}" ]; then
    cp "$FLEXD" "$D/bin/flexd"
  else
    log "build: flexd (cargo build --release -p flexd)"
    (cd "$repo" && cargo build --release -p flexd >&2)
    cp "$(cd "$repo" && cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/release/flexd" "$D/bin/flexd"
  fi
  local tool
  for tool in "${SIDECARS[@]}" storage-e2e ginkgo agnhost; do
    log "build: $tool (tests/e2e/tools.sh $tool; cached per machine)"
    ln -sf "$("$here/tools.sh" $tool)" "$D/bin/$tool"
  done
  # Ginkgo's CLI runs a compiled suite by its .test name.
  ln -sf "$D/bin/storage-e2e" "$D/bin/storage-e2e.test"
  log "build: pause, recorder"
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly PATH=$PATH:/usr/local/go/bin go build -o "$D/bin/pause" ./cmd/pause)
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly PATH=$PATH:/usr/local/go/bin go build -o "$D/bin/recorder" ./cmd/recorder)
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
  tar -C "$work/oci" -cf "$work/image.tar" .
  ctr images import --base-name "$name" "$work/image.tar" >/dev/null
  ctr images ls -q | grep -x "$ref" >/dev/null || die "image $ref is not in containerd after the import"
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
  incluster setsid "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
}

apiserver_ready() {
  innet curl -fsS --cacert "$D/pki/ca.crt" -H "Authorization: Bearer $TOKEN" "https://$NODE_IP:6443/readyz"
}

node_ready() {
  [ "$(kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# The cluster's processes, started by `up` and again by the node-restart scenario (a node's boot:
# the disk as it was, no process, no mount of the pods, no cgroup).
start_init() {
  log "up: pid and mount namespaces, init = pause"
  setsid unshare --pid --fork --kill-child --mount --propagation unchanged --mount-proc \
    nsenter --net=/run/netns/$NETNS "$D/bin/pause" \
    >"$D/logs/init.log" 2>&1 </dev/null &
  echo $! >"$D/run/unshare.pid"
  wait_for 10 "the cluster's init" pgrep -P "$(cat "$D/run/unshare.pid")"
  pgrep -P "$(cat "$D/run/unshare.pid")" >"$D/run/init.pid"

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

  for hierarchy in /sys/fs/cgroup/*/; do
    [ "$hierarchy" = /sys/fs/cgroup/unified/ ] || mkdir -p "$hierarchy$CGROUP_ROOT"
  done
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
    --flex-volume-plugin-dir="$D/plugins"
  start kube-scheduler "$D/bin/kube" kube-scheduler \
    --kubeconfig="$D/kubeconfig" --leader-elect=false --bind-address=127.0.0.1
}

start_containerd() {
  start containerd containerd --config "$D/containerd/config.toml"
  wait_for 60 "containerd" ctr version
}

kubelet_command() {
  echo "$D/bin/kube" kubelet --config="$D/kubelet.yaml" --kubeconfig="$D/kubeconfig" \
    --root-dir="$D/kubelet" --cert-dir="$D/pki/kubelet" \
    --hostname-override=$NODE --node-ip=$NODE_IP
}

start_kubelet() {
  # Appended: a restarted kubelet's log follows the first one's.
  incluster setsid $(kubelet_command) >>"$D/logs/kubelet.log" 2>&1 </dev/null &
}

up() {
  preflight
  down
  rm -rf "$D.logs"
  local started=$SECONDS
  build
  mkdir -p "$D"/{logs,run,etcd,plugins,flexd-state,kubelet,volumes,cni/net.d,containerd}
  # A shared mount: kubelet and the flexd pod's Bidirectional mounts propagate through it.
  mount --bind "$D" "$D"
  mount --make-rshared "$D"

  log "up: network namespace $NETNS ($NODE_IP; nothing leads out)"
  # `ip netns add` makes /run/netns a mount (and the dir) when it is not one: down undoes that.
  [ -d /run/netns ] || touch "$D/run/made-run-netns"
  mountpoint -q /run/netns 2>/dev/null || touch "$D/run/made-run-netns-mount"
  ip netns add $NETNS
  ip -n $NETNS link set lo up
  # What kube-proxy would do for the API server's Service (default/kubernetes, the first address of
  # the service range, port 443): the sidecars reach the API server by their in-cluster config.
  # The cluster has no kube-proxy; this is the one Service its pods use.
  innet nft -f - <<EOF
table ip e2e-services {
  chain prerouting { type nat hook prerouting priority dstnat; ip daddr $API_SERVICE_IP tcp dport 443 dnat to $NODE_IP:6443; }
  chain output { type nat hook output priority -100; ip daddr $API_SERVICE_IP tcp dport 443 dnat to $NODE_IP:6443; }
}
EOF
  # The node's address on a dummy interface where the kernel has one, else on lo: either way
  # it is local to this namespace, which has no other interface.
  if ip -n $NETNS link add e2e0 type dummy 2>/dev/null; then
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
  # address on a bridge inside the cluster's netns: probes reach them, they reach the node's
  # address, and nothing leads further.
  cat >"$D/cni/net.d/10-bridge.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "e2e-pods", "plugins": [{"type": "bridge", "bridge": "e2e-pods",
  "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local", "dataDir": "$D/cni/ipam",
  "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  cat >"$D/containerd/config.toml" <<EOF
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$D/containerd/containerd.sock"
[ttrpc]
  address = "$D/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$D/containerd/opt"
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
    conf_dir = "$D/cni/net.d"
EOF
  start_containerd

  log "up: images $PAUSE_IMAGE, $FLEXD_IMAGE, $TOOLS_IMAGE, ${SIDECARS[*]}, the storage suite's"
  image "$PAUSE_IMAGE" populate_pause /pause
  image "$FLEXD_IMAGE" populate_flexd /usr/local/bin/flexd
  image "$TOOLS_IMAGE" populate_tools /bin/sh
  local sidecar
  for sidecar in "${SIDECARS[@]}"; do
    SIDECAR=$sidecar image "localhost/$sidecar:e2e" populate_sidecar "/$sidecar"
  done
  # The suite's pods run Kubernetes' test images, by the names this Kubernetes gives them:
  # busybox, and a Debian (glibc) userland for the specs that ask for glibc-dns-testing.
  local images; images=$("$D/bin/storage-e2e" -print-images)
  image "$(awk '$1 == "busybox" {print $2}' <<<"$images")" populate_tools /bin/sh
  image "$(awk '$1 == "glibc-dns-testing" {print $2}' <<<"$images")" populate_glibc /bin/sh
  # nginx's: the volumes suite's exec spec runs a shell script in it, never nginx itself.
  image "$(awk '$1 == "nginx" {print $2}' <<<"$images")" populate_tools /bin/sh
  IMAGE_CMD=(pause)
  image "$(awk '$1 == "agnhost" {print $2}' <<<"$images")" populate_agnhost /agnhost
  IMAGE_CMD=()

  log "up: the driver $DRIVER in the plugin dir"
  sed "s|^ROOT=.*|ROOT=$D/volumes|" "$here/drivers/hostdir" >"$D/run/hostdir"
  chmod 0755 "$D/run/hostdir"
  "$D/bin/flexd" --plugin-dir "$D/plugins" install --driver "$DRIVER" "$D/run/hostdir" >&2

  log "up: kubelet"
  cat >"$D/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$D/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
volumePluginDir: $D/plugins
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
EOF
  start_kubelet
  wait_for 180 "node $NODE Ready" node_ready
  wait_for 60 "the default service account" kubectl get serviceaccount default
  log "up: cluster ready in $((SECONDS - started))s"
  cat >"$D/env" <<EOF
export KUBECONFIG=$D/kubeconfig
# The API server is in the network namespace $NETNS: run kubectl there, e.g.
#   nsenter --net=/run/netns/$NETNS $D/bin/kube kubectl get nodes
EOF
  cat "$D/env"
}

# --- scenarios -----------------------------------------------------------------------------

# The operator's choices for this cluster: its plugin dir, and inline volumes for the hostdir
# drivers (the oracle's inline volume, the fault pods), which are offered only when asked for.
operator_flags() {
  local driver flags=(--image "$FLEXD_IMAGE" --kubelet-dir "$D/kubelet" --node-plugin-dir "$D/plugins")
  for driver in "$DRIVER" e2e/rec-hostdir; do
    [ ! -d "$D/plugins/${driver/\//\~}" ] || flags+=(--inline-volumes "$driver")
  done
  # The recorder in front of the loop driver attaches loop devices as the loop driver does.
  [ ! -d "$D/plugins/e2e~rec-loop" ] || flags+=(--privileged-controller e2e/rec-loop)
  echo "${flags[@]}"
}

flexd_manifests() {
  # shellcheck disable=SC2046
  "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" manifests \
    --driver "$DRIVER" $(operator_flags)
}

healthz() { [ "$(innet curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9808/healthz)" = 200 ]; }

csinode_lists_driver() {
  kubectl get csinode $NODE -o jsonpath='{.spec.drivers[*].name}' | grep -w "$CSI_NAME" >/dev/null
}

# 1. flexd's manifests, applied unmodified: the node DaemonSet Ready, its CSIDriver, the driver
#    registered with kubelet (CSINode), /healthz; no controller side for a node-only driver.
scenario_deploy() {
  flexd_manifests >"$D/run/flexd.yaml"
  kubectl apply -f - <"$D/run/flexd.yaml"
  kubectl -n $NAMESPACE rollout status daemonset/flexd-node --timeout=240s
  [ "$(kubectl -n $NAMESPACE get daemonset flexd-node -o jsonpath='{.status.numberReady}')" = 1 ]
  [ -z "$(kubectl -n $NAMESPACE get deployments -o name)" ] || { echo "a node-only driver got a controller Deployment"; return 1; }
  local csidriver
  csidriver=$(kubectl get csidriver -o json)
  [ "$(jq '.items | length' <<<"$csidriver")" = 1 ]
  jq -e --arg n "$CSI_NAME" '.items[0] | .metadata.name == $n and .spec.attachRequired == false
    and .spec.podInfoOnMount == true and .spec.fsGroupPolicy == "File"
    and (.spec.volumeLifecycleModes | sort) == ["Ephemeral", "Persistent"]' <<<"$csidriver"
  wait_for 120 "CSINode $NODE to list $CSI_NAME" csinode_lists_driver
  wait_for 30 "flexd's /healthz" healthz
  # The metrics and health port is on the node's loopback only, not on its address.
  if innet curl -s -o /dev/null --max-time 5 "http://$NODE_IP:9808/healthz"; then
    echo "flexd's metrics port answers on the node's address $NODE_IP"; return 1
  fi
}

# A pod on the node (hostNetwork: no traffic leaves the cluster's netns) running SCRIPT with the
# volume VOLUME_YAML at /data. pod NAME SCRIPT VOLUME_YAML [SECURITY_CONTEXT_YAML]
pod() {
  pod_create "$@"
  pod_ready "$1" 180
}

pod_create() { # NAME SCRIPT VOLUME_YAML [SECURITY_CONTEXT_YAML]: the pod, not waiting for it
  pod_manifest "$@" | kubectl apply -f -
}

pod_manifest() { # NAME SCRIPT VOLUME_YAML [SECURITY_CONTEXT_YAML]
  local security=${4:-"{}"}
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: $security
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

pod_ready() { # NAME SECONDS: Ready, its script done, its log in $D/run/NAME.log
  kubectl wait --for=condition=Ready pod/$1 --timeout=${2}s
  wait_for 60 "pod $1's script" script_done "$1"
  kubectl logs "$1" >"$D/run/$1.log"
  cat "$D/run/$1.log"
}

script_done() { kubectl logs "$1" | grep -x DONE >/dev/null; }
claim_bound() { [ "$(kubectl get pvc "$1" -o jsonpath='{.status.phase}')" = Bound ]; }
delete_pod() { kubectl delete pod "$1" --wait=true --timeout=120s; }

# The pod's volume dir in kubelet's dir is (not) a mount point: mounted PODNAME VOLUME-NAME
pod_uid() { kubectl get pod "$1" -o jsonpath='{.metadata.uid}'; }
volume_target() { echo "$D/kubelet/pods/$1/volumes/kubernetes.io~csi/$2/mount"; }
mounted() { findmnt -rn -o TARGET | grep -x "$1" >/dev/null; }
not_mounted() { ! mounted "$1"; }

volumes() { "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" volume list; }
no_record() { ! volumes | grep -F "$1" >/dev/null; }

# pv_yaml NAME SIZE SOURCE: a PersistentVolume (SOURCE: its volume source, e.g.
# 'csi: {...}') and a claim bound to it, as YAML.
pv_yaml() {
  cat <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: $1}
spec:
  capacity: {storage: $2}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  $3
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: $1
  resources: {requests: {storage: $2}}
EOF
}

static_pv() { # NAME GREETING
  pv_yaml "$1" 1Gi "csi: {driver: ${PV_DRIVER:-$CSI_NAME}, volumeHandle: $1, volumeAttributes: {greeting: \"$2\"}}" |
    kubectl apply -f -
  wait_for 60 "claim $1 Bound" claim_bound "$1"
}

# 2. A static PV + claim of the node-only driver: the pod reads what the driver's mount wrote
#    (with the PV's volumeAttributes), writes back to the host directory, and the volume is
#    unmounted from kubelet's dir when the pod goes.
scenario_static_pv() {
  static_pv e2e-static "from the static PV"
  pod e2e-static 'cat /data/driver; echo written-by-pod > /data/pod' \
    "    persistentVolumeClaim: {claimName: e2e-static}"
  grep -qx 'hostdir e2e-static from the static PV' "$D/run/e2e-static.log"
  [ "$(cat "$D/volumes/e2e-static/pod")" = written-by-pod ]
  local target; target=$(volume_target "$(pod_uid e2e-static)" e2e-static)
  mounted "$target"
  # flexd's record of the publish (what a restarted flexd resumes from), gone after unpublish.
  volumes | grep -F "$target" | grep -w e2e-static >/dev/null
  delete_pod e2e-static
  wait_for 60 "$target to be unmounted" not_mounted "$target"
  wait_for 30 "flexd's record of $target to go" no_record "$target"
  [ "$(cat "$D/volumes/e2e-static/pod")" = written-by-pod ]
}

# 3. A CSI ephemeral inline volume: the same, with the options in the pod.
scenario_inline() {
  pod e2e-inline 'cat /data/driver; echo written-by-pod > /data/pod' \
    "    csi: {driver: $CSI_NAME, volumeAttributes: {volume: e2e-inline, greeting: inline hello}}"
  grep -qx 'hostdir e2e-inline inline hello' "$D/run/e2e-inline.log"
  [ "$(cat "$D/volumes/e2e-inline/pod")" = written-by-pod ]
  local target; target=$(volume_target "$(pod_uid e2e-inline)" data)
  mounted "$target"
  delete_pod e2e-inline
  wait_for 60 "$target to be unmounted" not_mounted "$target"
}

# 4. fsGroup: the volume's files belong to the pod's fsGroup as kubelet makes them (group
#    fsGroup, group read-write, setgid directories), and a non-root user of that group writes.
scenario_fsgroup() {
  local script='id -u; id -G; stat -c "%n %g %A" /data /data/driver; echo mine > /data/mine && stat -c "%n %u %g %A" /data/mine'
  local security="{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000}"
  static_pv e2e-fsgroup "fsgroup"
  pod e2e-fsgroup "$script" "    persistentVolumeClaim: {claimName: e2e-fsgroup}" "$security"
  local log=$D/run/e2e-fsgroup.log
  # kubelet's SetVolumeOwnership: group fsGroup, mode |= 0660, and directories |= setgid 0110.
  grep -qx '1000' "$log"
  grep -qx '3000 2000' "$log"
  grep -qx '/data 2000 drwxrwsr-x' "$log"
  grep -qx '/data/driver 2000 -rw-rw-r--' "$log"
  # The pod's user writes through the group; the setgid directory hands the group on.
  grep -qx '/data/mine 1000 2000 -rw-r--r--' "$log"
  delete_pod e2e-fsgroup
  # And exactly what kubelet's own FlexVolume plugin makes of the same driver's volume.
  flex_pv e2e-fsgroup-flex "fsgroup"
  pod e2e-fsgroup-flex "$script" "    persistentVolumeClaim: {claimName: e2e-fsgroup-flex}" "$security"
  diff "$D/run/e2e-fsgroup-flex.log" "$log"
  delete_pod e2e-fsgroup-flex
}

flex_pv() { # NAME GREETING: a FlexVolume PV (kubelet's own FlexVolume plugin) and its claim
  pv_yaml "$1" 1Gi "flexVolume: {driver: $DRIVER, options: {greeting: \"$2\"}}" | kubectl apply -f -
  wait_for 60 "claim $1 Bound" claim_bound "$1"
}

pv_gone() { ! kubectl get pv "$1"; }

# 5. Migration (docs/migration.md#cut-over): a FlexVolume PV mounted by kubelet's own FlexVolume
#    plugin from the same plugin dir, data written; the cut-over with `flexd migrate`; a new pod
#    reads the same data through flexd serve.
scenario_migrate() {
  flex_pv e2e-migrate "through FlexVolume"
  pod e2e-migrate-before 'cat /data/driver; echo before-migration > /data/payload' \
    "    persistentVolumeClaim: {claimName: e2e-migrate}"
  grep -qx 'hostdir e2e-migrate through FlexVolume' "$D/run/e2e-migrate-before.log"
  # kubelet's FlexVolume plugin mounted it: its dir, not the CSI plugin's.
  local target
  target=$D/kubelet/pods/$(pod_uid e2e-migrate-before)/volumes/${DRIVER/\//\~}/e2e-migrate
  mounted "$target"
  delete_pod e2e-migrate-before
  wait_for 60 "$target to be unmounted" not_mounted "$target"
  # The cut-over, as docs/migration.md says it.
  kubectl get pv e2e-migrate -o yaml | "$D/bin/flexd" --plugin-dir "$D/plugins" migrate -f - >"$D/run/migrated.yaml"
  cat "$D/run/migrated.yaml"
  kubectl delete pv e2e-migrate --wait=false
  kubectl patch pv e2e-migrate -p '{"metadata":{"finalizers":null}}' || true
  wait_for 60 "the FlexVolume PV to go" pv_gone e2e-migrate
  kubectl create -f "$D/run/migrated.yaml"
  [ "$(kubectl get pv e2e-migrate -o jsonpath='{.spec.csi.driver}')" = "$CSI_NAME" ]
  wait_for 120 "claim e2e-migrate Bound again" claim_bound e2e-migrate
  pod e2e-migrate-after 'cat /data/driver /data/payload' \
    "    persistentVolumeClaim: {claimName: e2e-migrate}"
  grep -qx 'hostdir e2e-migrate through FlexVolume' "$D/run/e2e-migrate-after.log"
  grep -qx 'before-migration' "$D/run/e2e-migrate-after.log"
  target=$(volume_target "$(pod_uid e2e-migrate-after)" e2e-migrate)
  mounted "$target"
  delete_pod e2e-migrate-after
  wait_for 60 "$target to be unmounted" not_mounted "$target"
}

# --- the installer DaemonSet and faults (issue 25) -------------------------------------------

LATE_DRIVER=e2e/late
LATE_CSI_NAME=flexvolume-e2e--late
INSTALLER_IMAGE=localhost/flexd-installer:e2e

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

csinode_lists() { kubectl get csinode $NODE -o jsonpath='{.spec.drivers[*].name}' | grep -w "$1" >/dev/null; }
csinode_lacks() { ! csinode_lists "$1"; }
flexd_pod() { kubectl -n $NAMESPACE get pod -l app.kubernetes.io/name=flexd-node -o jsonpath='{.items[0].metadata.name}'; }
flexd_pod_state() { # uid and restart count of the node pod
  kubectl -n $NAMESPACE get pod -l app.kubernetes.io/name=flexd-node \
    -o jsonpath='{.items[0].metadata.uid} {.items[0].status.containerStatuses[0].restartCount}'
}
new_flexd_pod() { [ "$(flexd_pod_state | cut -d' ' -f1)" != "$1" ]; }
kubelet_pids() { pgrep -f -x "$(kubelet_command)"; }
kubelet_healthz() { [ "$(innet curl -s http://127.0.0.1:10248/healthz)" = ok ]; }

# 6. A driver installed by the installer DaemonSet (deploy/installer-daemonset.yaml, its image as
#    deploy/Dockerfile's installer target) while everything runs: flexd registers it with kubelet
#    (CSINode) with neither restarted; the operator re-applies `flexd manifests` for its CSIDriver
#    (the node pod is unchanged by it); a pod reads its data; `flexd uninstall` refuses while the
#    volume is mounted and removes it once unmounted; kubelet forgets it. The node pod cannot
#    write the plugin dir: only the installer and the operator do.
scenario_installer() {
  local before kubelet_before target
  before=$(flexd_pod_state)
  kubelet_before=$(kubelet_pids)
  [ ! -e "$D/plugins/e2e~late" ]
  sed "s|^ROOT=.*|ROOT=$D/volumes|" "$here/drivers/hostdir" >"$D/run/late"
  IMAGE_ENV=(FLEXD_DRIVER=$LATE_DRIVER)
  image "$INSTALLER_IMAGE" populate_installer /bin/sh -c \
    'exec /usr/local/bin/flexd --plugin-dir /flexmnt install --driver "$FLEXD_DRIVER" /driver --then-sleep'
  IMAGE_ENV=()
  # The DaemonSet as shipped, with this image and this kubelet's plugin dir, and hostNetwork as
  # every pod here (the cluster has no pod network: its CNI is loopback only).
  sed -e "s|image: registry.example/acme/tmpfs-installer:1.0.0|image: $INSTALLER_IMAGE\n          imagePullPolicy: Never|" \
    -e "s|^      tolerations:|      hostNetwork: true\n      tolerations:|" \
    -e "s|path: /usr/libexec/kubernetes/kubelet-plugins/volume/exec|path: $D/plugins|" \
    "$repo/deploy/installer-daemonset.yaml" >"$D/run/installer.yaml"
  grep -q "image: $INSTALLER_IMAGE" "$D/run/installer.yaml"
  grep -q "path: $D/plugins\$" "$D/run/installer.yaml"
  grep -q "hostNetwork: true" "$D/run/installer.yaml"
  kubectl apply -f "$D/run/installer.yaml"
  kubectl -n kube-system rollout status daemonset/flex-deploy --timeout=180s
  wait_for 60 "the installed driver" test -x "$D/plugins/e2e~late/late"
  cmp "$D/run/late" "$D/plugins/e2e~late/late"
  wait_for 120 "CSINode $NODE to list $LATE_CSI_NAME" csinode_lists $LATE_CSI_NAME
  # What the operator is told: re-apply `flexd manifests` (every installed driver) for the new
  # driver's CSIDriver; kubelet alone would wait for an attachment nobody makes.
  ! kubectl get csidriver $LATE_CSI_NAME
  # shellcheck disable=SC2046
  "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" manifests \
    $(operator_flags) >"$D/run/flexd-late.yaml"
  kubectl apply -f "$D/run/flexd-late.yaml"
  kubectl get csidriver $LATE_CSI_NAME -o json | jq -e '.spec.attachRequired == false'
  kubectl get csidriver $CSI_NAME
  # Neither flexd nor kubelet restarted: the same node pod, no container restart, same kubelet.
  [ "$(flexd_pod_state)" = "$before" ] || { echo "flexd's node pod changed: $before -> $(flexd_pod_state)"; return 1; }
  [ "$(kubelet_pids)" = "$kubelet_before" ]
  PV_DRIVER=$LATE_CSI_NAME static_pv e2e-late "installed late"
  pod e2e-late 'cat /data/driver; echo late > /data/pod' "    persistentVolumeClaim: {claimName: e2e-late}"
  grep -qx 'hostdir e2e-late installed late' "$D/run/e2e-late.log"
  [ "$(cat "$D/volumes/e2e-late/pod")" = late ]
  target=$(volume_target "$(pod_uid e2e-late)" e2e-late)
  mounted "$target"
  # flexd uninstall by the operator on the node: the plugin dir, and the state dir whose records
  # say which volumes still use the driver.
  local uninstall=("$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state"
    uninstall --driver $LATE_DRIVER)
  if "${uninstall[@]}" >"$D/run/uninstall.out" 2>&1; then
    cat "$D/run/uninstall.out"; echo "flexd uninstall removed a driver in use"; return 1
  fi
  cat "$D/run/uninstall.out"
  grep -q 'is used by 1 mounted volume' "$D/run/uninstall.out"
  [ -x "$D/plugins/e2e~late/late" ]
  delete_pod e2e-late
  wait_for 60 "$target to be unmounted" not_mounted "$target"
  wait_for 30 "flexd's record of $target to go" no_record "$target"
  kubectl -n kube-system delete daemonset flex-deploy --wait=true --timeout=120s
  # The node pod reads the plugin dir and cannot change it: its mount is read-only.
  if kubectl -n $NAMESPACE exec "$(flexd_pod)" -c flexd -- flexd --plugin-dir "$D/plugins" \
    --state-dir "$D/flexd-state" uninstall --driver $LATE_DRIVER >"$D/run/uninstall-in-pod.out" 2>&1; then
    cat "$D/run/uninstall-in-pod.out"; echo "the node pod could write the plugin dir"; return 1
  fi
  grep -q 'Read-only file system' "$D/run/uninstall-in-pod.out" ||
    { cat "$D/run/uninstall-in-pod.out"; echo "the node pod's uninstall failed for another reason"; return 1; }
  [ -x "$D/plugins/e2e~late/late" ]
  "${uninstall[@]}"
  [ ! -e "$D/plugins/e2e~late" ]
  wait_for 120 "CSINode $NODE to drop $LATE_CSI_NAME" csinode_lacks $LATE_CSI_NAME
  kubectl delete pvc e2e-late --wait=false
  kubectl delete pv e2e-late --wait=false
  kubectl delete csidriver $LATE_CSI_NAME
  [ "$(flexd_pod_state)" = "$before" ]
}

FAULT_PODS=${E2E_FAULT_PODS:-10}

fault_pod() { # N: a pod with an inline volume of its own, reading it
  pod_create e2e-fault-$1 'cat /data/driver' \
    "    csi: {driver: $CSI_NAME, volumeAttributes: {volume: e2e-fault-$1, greeting: fault $1}}"
}

# Every fault pod Ready within SECONDS, reading its own data (its log, and its container now),
# its volume mounted once on its target, and flexd holding one record of it.
fault_pods_ok() {
  local seconds=$1 i target
  for i in $(seq 1 $FAULT_PODS); do
    pod_ready e2e-fault-$i "$seconds" >/dev/null
    grep -qx "hostdir e2e-fault-$i fault $i" "$D/run/e2e-fault-$i.log"
    wait_for "$seconds" "pod e2e-fault-$i's container to read its volume" reads_own_volume $i
    target=$(volume_target "$(pod_uid e2e-fault-$i)" data)
    [ "$(findmnt -rn -o TARGET | grep -cxF "$target")" = 1 ] || { echo "$target: not mounted once"; findmnt -rn -o TARGET | grep -F "$target"; return 1; }
    [ "$(volumes | grep -cF "$target")" = 1 ] || { echo "$target: not one record"; volumes; return 1; }
  done
  # Nothing else: exactly the fault pods' volumes are mounted in kubelet's dir and recorded.
  [ "$(findmnt -rn -o TARGET | grep -c "^$D/kubelet/pods/.*/volumes/kubernetes.io~csi/")" = $FAULT_PODS ] ||
    { echo "CSI volume mounts in kubelet's dir:"; findmnt -rn -o TARGET | grep "^$D/kubelet/pods/.*/volumes/kubernetes.io~csi/"; return 1; }
  [ "$(volumes | tail -n +2 | wc -l)" = $FAULT_PODS ] || { echo "flexd's records:"; volumes; return 1; }
}

reads_own_volume() { [ "$(kubectl exec e2e-fault-$1 -- cat /data/driver)" = "hostdir e2e-fault-$1 fault $1" ]; }

fault_states() { # uid and restart count of every fault pod
  local i
  for i in $(seq 1 $FAULT_PODS); do
    kubectl get pod e2e-fault-$i -o jsonpath='{.metadata.uid} {.status.containerStatuses[0].restartCount}{"\n"}'
  done
}

# 7. The node pod deleted while FAULT_PODS pods with volumes start: every pod Running with its data.
scenario_faults_pod() {
  local i half=$((FAULT_PODS / 2)) before
  before=$(flexd_pod_state)
  for i in $(seq 1 $half); do fault_pod $i; done
  kubectl -n $NAMESPACE delete pod "$(flexd_pod)" --wait=false
  for i in $(seq $((half + 1)) $FAULT_PODS); do fault_pod $i; done
  wait_for 120 "a new node pod" new_flexd_pod "${before%% *}"
  kubectl -n $NAMESPACE rollout status daemonset/flexd-node --timeout=240s
  fault_pods_ok 300
  fault_states >"$D/run/fault-states"
}

# 8. kubelet killed and started again: the pods keep running with their volumes (same pods, no
#    container restart, mounted once, readable), and a new pod mounts.
scenario_faults_kubelet() {
  local before; before=$(fault_states)
  kill -KILL $(kubelet_pids)
  wait_for 30 "kubelet to end" sh -c "! pgrep -f -x '$(kubelet_command)'"
  start_kubelet
  wait_for 120 "kubelet's /healthz" kubelet_healthz
  wait_for 120 "node $NODE Ready" node_ready
  [ "$(fault_states)" = "$before" ] || { echo "pods changed: $before -> $(fault_states)"; return 1; }
  fault_pods_ok 120
  pod e2e-after-kubelet 'cat /data/driver' \
    "    csi: {driver: $CSI_NAME, volumeAttributes: {volume: e2e-after-kubelet, greeting: after kubelet}}"
  grep -qx 'hostdir e2e-after-kubelet after kubelet' "$D/run/e2e-after-kubelet.log"
  local target; target=$(volume_target "$(pod_uid e2e-after-kubelet)" data)
  mounted "$target"
  delete_pod e2e-after-kubelet
  wait_for 60 "$target to be unmounted" not_mounted "$target"
  wait_for 30 "flexd's record of $target to go" no_record "$target"
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

remove_cgroups() {
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/"$CGROUP_ROOT" /sys/fs/cgroup/"$CGROUP_ROOT"; do
    [ -d "$hierarchy" ] || continue
    find "$hierarchy" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ ! -d "$hierarchy" ] || log "WARNING: cgroup $hierarchy could not be removed"
  done
}

netns_empty() { [ -z "$(ip netns pids $NETNS)" ]; }

# Every process in the cluster's network namespace started after TICKS (clock ticks since boot,
# as /proc/PID/stat's starttime): none survived from before.
no_process_before() {
  local pid start bad=0
  for pid in $(ip netns pids $NETNS); do
    start=$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) || continue
    [ -z "$start" ] || ((start >= $1)) ||
      { echo "process $pid from before the restart: $(tr '\0' ' ' <"/proc/$pid/cmdline")"; bad=1; }
  done
  return $bad
}

now_ticks() { awk -v hz="$(getconf CLK_TCK)" '{printf "%d\n", $1 * hz}' /proc/uptime; }

# 9. A node restart: every process of the cluster killed (containers too), every mount under the
#    scratch dir gone (the pods' volumes, the containers' root filesystems), the cgroups gone;
#    then everything started again as `up` does. Every pod Running with its data, each volume
#    mounted once and recorded once, no process from before; then the pods go and leave no mount
#    or record (and `down`, after, leaves nothing).
# Every fault pod's container is a new one since the states in FILE (the restart count grew).
all_restarted() {
  local uid count now
  while read -r uid count; do
    now=$(kubectl get pods -o json | jq -r --arg u "$uid" '.items[] | select(.metadata.uid == $u) | .status.containerStatuses[0].restartCount')
    [ -n "$now" ] && ((now > count)) || return 1
  done <"$1"
}

scenario_faults_node() {
  local init; init=$(cat "$D/run/init.pid")
  fault_states >"$D/run/fault-states-before-restart"
  kill -KILL "$init"
  wait_for 60 "every process of the cluster to end" netns_empty
  unmount_under "$D"
  [ -z "$(findmnt -rn -o TARGET | grep "^$D/kubelet/pods/")" ]
  remove_cgroups
  local booted; booted=$(now_ticks)
  log "node restart: starting again"
  start_init
  start_control_plane
  start_containerd
  start_kubelet
  wait_for 120 "kubelet's /healthz" kubelet_healthz
  wait_for 180 "node $NODE Ready" node_ready
  kubectl -n $NAMESPACE rollout status daemonset/flexd-node --timeout=240s
  wait_for 120 "CSINode $NODE to list $CSI_NAME" csinode_lists_driver
  wait_for 300 "every fault pod's container to start again" all_restarted "$D/run/fault-states-before-restart"
  fault_pods_ok 300
  no_process_before "$booted"
  local i targets=()
  for i in $(seq 1 $FAULT_PODS); do targets+=("$(volume_target "$(pod_uid e2e-fault-$i)" data)"); done
  kubectl delete pod $(for i in $(seq 1 $FAULT_PODS); do echo e2e-fault-$i; done) --wait=true --timeout=180s
  for target in "${targets[@]}"; do
    wait_for 60 "$target to be unmounted" not_mounted "$target"
    wait_for 30 "flexd's record of $target to go" no_record "$target"
  done
  [ -z "$(findmnt -rn -o TARGET | grep "^$D/kubelet/pods/.*/volumes/kubernetes.io~csi/")" ]
  [ "$(volumes | tail -n +2 | wc -l)" = 0 ] || { volumes; return 1; }
}

# --- Kubernetes' storage e2e suite ------------------------------------------------------------

# The suite's specs that are not run, by choice, with the reason (README, "The storage suite"):
# - [Disruptive] specs restart kubelet or the node over SSH, which this cluster has no use for
#   (the faults_* scenarios restart them for real);
# - "any volume data source" runs Kubernetes' volume populator example (hello-populator) and
#   the volume-data-source-validator, whose modules the Go module proxy does not serve: no
#   image of them can be built here. It tests those controllers, not the driver.
STORAGE_SKIP='\[Disruptive\]|should provision storage with any volume data source'

# storage_definition DRIVER [INLINE_ATTRIBUTES_JSON]: Kubernetes' test-driver definition
# (test/e2e/storage/external) of a driver flexd serves, derived from what flexd read at the
# driver's init (`flexd drivers`) and the CSIDriver its manifests made, so that a driver is
# tested for what it declares. Capabilities flexd does not offer at all (block volumes,
# snapshots, cloning, topology, ReadWriteMany, capacity) are declared absent: the suite skips them.
storage_definition() {
  local csidriver
  csidriver=$(kubectl get csidriver "$(flexd_driver "$1" | jq -r .csiName)" -o json)
  flexd_driver "$1" | jq --argjson csidriver "$csidriver" --argjson inline "${2:-null}" '
    .capabilities as $c
    # FlexVolume defaults: attach unless the driver says false; the rest only when true.
    | (($c.attach != false) or ($c.provision == true)) as $controller
    | (($c.requiresFSResize == true) and $controller) as $expands
    | {
      StorageClass: {FromName: ($c.provision == true)},
      InlineVolumes: (if ($csidriver.spec.volumeLifecycleModes | index("Ephemeral")) and $inline != null
        then [{Attributes: $inline, Shared: true}] else [] end),
      DriverInfo: {
        Name: .csiName,
        SupportedSizeRange: {Min: "64Mi", Max: "1Gi"},
        SupportedFsType: {"": {}},
        MaxFileSize: 1048576,
        Capabilities: {
          persistence: ($c.provision == true),
          exec: true,
          fsGroup: ($csidriver.spec.fsGroupPolicy != "None"),
          # flexd offers VOLUME_MOUNT_GROUP for a driver with fsGroup (FlexVolume default: true)
          # and applies the ownership itself; kubelet then leaves fsGroupChangePolicy aside.
          volumeMountGroup: ($c.fsGroup != false),
          multipods: true,
          singleNodeVolume: true,
          controllerExpansion: $expands,
          nodeExpansion: $expands,
          onlineExpansion: $expands,
          offlineExpansion: $expands,
          block: false, snapshotDataSource: false, pvcDataSource: false, topology: false,
          RWX: false, volumeLimits: false, capacity: false, readWriteOncePod: false
        }
      }
    }'
}

flexd_driver() { # DRIVER: its entry in `flexd drivers --output json`
  "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" --output json drivers |
    jq -e --arg name "$1" '.[] | select(.name == $name)'
}

# storage_suite LABEL DEFINITION: the suite against one driver, E2E_STORAGE_PROCS (default 5)
# specs at a time (they mostly wait for pods and mounts; [Serial] ones run alone at the end);
# its log in $D/logs/storage-LABEL.log, a line "storage LABEL: N passed, M failed, K skipped" in
# the scenario's summary (printed after its PASS or FAIL).
storage_suite() {
  local label=$1 definition=$2 log=$D/logs/storage-$1.log status counts
  set +e
  innet "$D/bin/ginkgo" --procs "${E2E_STORAGE_PROCS:-5}" --focus 'External.Storage' \
    --skip "$STORAGE_SKIP" --no-color --timeout "${E2E_STORAGE_TIMEOUT:-60m}" \
    --junit-report "$D/logs/storage-$label.xml" "$D/bin/storage-e2e.test" -- \
    -kubeconfig "$D/kubeconfig" -storage.testdriver "$definition" >"$log" 2>&1
  status=$?
  set -e
  counts=$(grep -E '^(SUCCESS|FAIL)! -- [0-9]+ Passed' "$log" | tail -1)
  echo "storage $label: $(sed -E 's/.*-- ([0-9]+) Passed \| ([0-9]+) Failed \| [0-9]+ Pending \| ([0-9]+) Skipped.*/\1 passed, \2 failed, \3 skipped/' <<<"${counts:-no summary}") in $(grep -oE '^Ran [0-9]+ of [0-9]+ Specs in [0-9.]+ seconds' "$log" | grep -oE '[0-9.]+ seconds' || echo '?')" >>"$D/logs/scenario-storage.summary"
  echo "storage $label: $(sed -E 's/.*-- ([0-9]+) Passed \| ([0-9]+) Failed \| [0-9]+ Pending \| ([0-9]+) Skipped.*/\1 passed, \2 failed, \3 skipped/' <<<"$counts")"
  if [ $status != 0 ]; then
    grep -E '^\s*\[FAIL\]|^  \[FAILED\]|Summarizing' -A2 "$log" | head -60
  fi
  return $status
}

# flexd's manifests for every installed driver, with the sidecars built here, applied and rolled
# out; the controller's state claim on a PV made for it (the cluster has no default
# StorageClass).
# The controller pod as hardened: no ServiceAccount token in flexd's container, the SIDECARS
# as uid 65532 with no capability, flexd's CSI socket for CSI_NAME 0660 for their group.
# controller_hardened CSI_NAME SIDECAR...
controller_hardened() {
  local csi_name=$1 pod uid sidecar pid sock; shift
  pod=$(kubectl -n $NAMESPACE get pod -l app.kubernetes.io/name=flexd-controller \
    --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
  if kubectl -n $NAMESPACE exec "$pod" -c flexd -- sh -c 'test -e /var/run/secrets/kubernetes.io/serviceaccount/token'; then
    echo "the controller's flexd container holds a ServiceAccount token"; return 1
  fi
  for sidecar in "$@"; do
    pid=$(pgrep -x $sidecar | head -1)
    [ -n "$pid" ] || { echo "no $sidecar process"; return 1; }
    awk '/^Uid:/ {exit !($2 == 65532)}' /proc/$pid/status || { echo "$sidecar does not run as uid 65532"; return 1; }
    awk '/^CapEff:/ {exit !($2 == "0000000000000000")}' /proc/$pid/status ||
      { echo "$sidecar has capabilities: $(grep CapEff /proc/$pid/status)"; return 1; }
  done
  uid=$(kubectl -n $NAMESPACE get pod "$pod" -o jsonpath='{.metadata.uid}')
  sock="$D/kubelet/pods/$uid/volumes/kubernetes.io~empty-dir/socket-dir/$csi_name/csi.sock"
  [ "$(stat -c %a:%g "$sock")" = 660:65532 ] || { echo "$sock is $(stat -c %a:%g "$sock"), not 660:65532"; return 1; }
}

# The controller's state claim's PV (the cluster has no default StorageClass).
controller_state_pv() {
  mkdir -p "$D/controller-state"
  kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: flexd-controller-state}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $D/controller-state, type: Directory}
  claimRef: {namespace: $NAMESPACE, name: flexd-controller-state}
EOF
}

apply_all_manifests() {
  controller_state_pv
  # flexd's manifests for every installed driver, with the sidecars built here.
  # shellcheck disable=SC2046
  "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" manifests \
    $(operator_flags) "${SIDECAR_IMAGES[@]}" >"$D/run/flexd-storage.yaml"
  kubectl apply -f "$D/run/flexd-storage.yaml"
  kubectl -n $NAMESPACE rollout status daemonset/flexd-node --timeout=240s
  kubectl -n $NAMESPACE rollout status deployment/flexd-controller --timeout=300s
}

ATTACH_DRIVER=e2e/attach
ATTACH_CSI_NAME=flexvolume-e2e--attach
attachment_of() { # PV: its VolumeAttachment's attached status, or nothing
  kubectl get volumeattachment -o json |
    jq -r --arg pv "$1" '.items[] | select(.spec.source.persistentVolumeName == $pv) | .status.attached'
}
attached() { [ "$(attachment_of "$1")" = true ]; }
no_attachment() { [ -z "$(attachment_of "$1")" ]; }

# 10. The controller for a driver whose attach sets up no device (examples/drivers/attachable as
#     e2e/attach): the manifests' controller runs unprivileged (root with CHOWN alone, no /dev, no
#     token), its non-root csi-attacher attaches through the 0660 socket, a pod writes to the
#     volume (attach, then on the node mountdevice and the default bind mount), and the volume is
#     detached when the pod goes.
scenario_controller() {
  local pid target
  "$D/bin/flexd" --plugin-dir "$D/plugins" install --driver $ATTACH_DRIVER \
    "$repo/examples/drivers/attachable/attachable" >&2
  controller_state_pv
  # shellcheck disable=SC2046
  "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" manifests \
    --driver "$DRIVER" --driver $ATTACH_DRIVER $(operator_flags) "${SIDECAR_IMAGES[@]}" \
    >"$D/run/flexd-controller.yaml"
  kubectl apply -f "$D/run/flexd-controller.yaml"
  kubectl -n $NAMESPACE rollout status deployment/flexd-controller --timeout=300s
  wait_for 120 "CSINode $NODE to list $ATTACH_CSI_NAME" csinode_lists $ATTACH_CSI_NAME
  controller_hardened $ATTACH_CSI_NAME csi-attacher
  pid=$(pgrep -f -- '--mode=controller' | head -1)
  [ -n "$pid" ] || { echo "no controller flexd"; return 1; }
  # CAP_CHOWN alone (bit 0): not privileged.
  awk '/^CapEff:/ {exit !($2 == "0000000000000001")}' /proc/$pid/status ||
    { echo "the controller's flexd has $(grep CapEff /proc/$pid/status), not CHOWN alone"; return 1; }
  PV_DRIVER=$ATTACH_CSI_NAME static_pv e2e-attach "attached"
  pod e2e-attach 'echo attached-by-pod > /data/pod; cat /data/pod' \
    "    persistentVolumeClaim: {claimName: e2e-attach}"
  grep -qx attached-by-pod "$D/run/e2e-attach.log"
  attached e2e-attach || { echo "no attached VolumeAttachment for e2e-attach"; return 1; }
  target=$(volume_target "$(pod_uid e2e-attach)" e2e-attach)
  mounted "$target"
  delete_pod e2e-attach
  wait_for 60 "$target to be unmounted" not_mounted "$target"
  wait_for 120 "the VolumeAttachment of e2e-attach to go" no_attachment e2e-attach
  kubectl delete pvc e2e-attach --wait=true --timeout=60s
  kubectl delete pv e2e-attach --wait=true --timeout=60s
  "$D/bin/flexd" --plugin-dir "$D/plugins" --state-dir "$D/flexd-state" uninstall --driver $ATTACH_DRIVER >&2
  kubectl delete csidriver $ATTACH_CSI_NAME
}

# 11. Kubernetes' own storage e2e suite for external CSI drivers (from the same Kubernetes
#     version as the cluster) against the two shapes of driver flexd serves: the builtin loop
#     driver (attach, provision, expansion; its controller side is the manifests' Deployment with
#     the real csi-attacher, csi-provisioner and csi-resizer) and the node-only hostdir driver
#     (CSI inline ephemeral volumes). Zero failures in both.
scenario_storage() {
  rm -f "$D/logs/scenario-storage.summary"
  "$D/bin/flexd" --plugin-dir "$D/plugins" install --builtin loop --image-dir "$D/loop-images" >&2
  apply_all_manifests
  controller_hardened $LOOP_CSI_NAME csi-attacher csi-provisioner csi-resizer
  wait_for 120 "CSINode $NODE to list $LOOP_CSI_NAME" csinode_lists $LOOP_CSI_NAME
  storage_definition $LOOP_DRIVER >"$D/run/storage-loop.json"
  storage_definition "$DRIVER" '{"volume": "e2e-storage-inline"}' >"$D/run/storage-hostdir.json"
  cat "$D/run/storage-loop.json" "$D/run/storage-hostdir.json"
  local failed_suites=0 restarts
  storage_suite loop "$D/run/storage-loop.json" || failed_suites=$((failed_suites + 1))
  storage_suite hostdir "$D/run/storage-hostdir.json" || failed_suites=$((failed_suites + 1))
  # flexd and the sidecars held on through both suites: no container of flexd's pods restarted
  # (an OOM kill, or a sidecar exiting on a lost connection to flexd, shows here).
  restarts=$(kubectl -n $NAMESPACE get pods -o json | jq -r '.items[] | .metadata.name as $pod
    | .status.containerStatuses[] | select(.restartCount > 0)
    | "\($pod)/\(.name): \(.restartCount) restarts, last \(.lastState.terminated.reason // "?")"')
  if [ -n "$restarts" ]; then
    echo "restarted during the storage suite: $restarts"
    failed_suites=$((failed_suites + 1))
  fi
  [ $failed_suites = 0 ]
}

# shellcheck source=tests/e2e/oracle.sh
. "$here/oracle.sh"

run_scenario() {
  local name=$1 started=$SECONDS
  log "scenario $name: start"
  # set -e holds in the subshell only outside a condition: run it, then look at its status.
  set +e
  (set -euo pipefail; "scenario_$name") >"$D/logs/scenario-$name.log" 2>&1
  local status=$?
  set -e
  if [ $status = 0 ]; then
    passed=$((passed + 1)); log "PASS $name ($((SECONDS - started))s)"
  else
    failed=$((failed + 1)); log "FAIL $name ($((SECONDS - started))s); its output:"
    sed 's/^/    /' "$D/logs/scenario-$name.log" >&2
  fi
  # A scenario's own summary (the storage suite's counts), shown whatever the outcome.
  if [ -f "$D/logs/scenario-$name.summary" ]; then sed 's/^/    /' "$D/logs/scenario-$name.summary" >&2; fi
}

# E2E_SCENARIOS="deploy inline" runs those only (in that order; deploy first: the others need it).
read -r -a SCENARIOS <<<"${E2E_SCENARIOS:-deploy static_pv inline fsgroup migrate installer faults_pod faults_kubelet faults_node controller storage discovery oracle}"

run_scenarios() {
  passed=0 failed=0
  local name
  for name in "${SCENARIOS[@]}"; do run_scenario "$name"; done
}

finish() {
  local status=$?
  if [ "${E2E_KEEP:-}" = 1 ]; then
    log "E2E_KEEP=1: the cluster stays up; tests/e2e/run.sh down removes it"
  else
    # Keep the logs of a failed run next to the scratch dir.
    if [ "${failed:-0}" != 0 ] || [ $status != 0 ]; then
      rm -rf "$D.logs" && cp -r "$D/logs" "$D.logs" 2>/dev/null && log "logs kept in $D.logs" || true
      # The pods' logs too (flexd's among them), as kubelet wrote them.
      cp -r "$D/var-log/pods" "$D.logs/pods" 2>/dev/null || true
    fi
    # A down that leaves something (it dies saying what) fails the run.
    if ! (down); then
      log "FAIL down: it did not remove everything"
      failed=$((${failed:-0} + 1))
    fi
  fi
  echo "${passed:-0} passed, ${failed:-0} failed"
  if [ "${failed:-0}" != 0 ] || [ $status != 0 ]; then exit 1; fi
}

# Sourced (to call its functions by hand), it stops here.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-all}" in
  up) up ;;
  down) [ "$(id -u)" = 0 ] || skip "not root"; down ;;
  test)
    run_scenarios
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ] ;;
  all)
    preflight
    passed=0 failed=0
    trap finish EXIT
    set +e
    (set -euo pipefail; up) >&2
    status=$?
    set -e
    if [ $status = 0 ]; then
      run_scenarios
    else
      failed=1; log "FAIL: the cluster did not come up (logs in $D/logs)"
    fi ;;
  *) echo "usage: $0 [up|down|test]" >&2; exit 2 ;;
esac
