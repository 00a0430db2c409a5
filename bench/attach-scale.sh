#!/usr/bin/env bash
# Attach and detach at scale, through flexd's controller against kube-controller-manager's own
# FlexVolume attach, on the e2e cluster of tests/e2e/run.sh (brought up here as its own
# E2E_NAME, removed at the end). Root.
#
# NODES nodes without kubelets (Node and CSINode objects made through the API, as kwok and
# kubemark do) and VOLUMES volumes of one attaching driver (tests/e2e/drivers/attachbench,
# which attaches in no time) attached across them, one pod each, by kube-controller-manager's
# attach/detach controller; then the pods deleted, until every volume is detached. Once through
# its FlexVolume plugin, once as CSI volumes through csi-attacher and flexd's controller. The
# scenario is tests/e2e/scenarios/attach_scale_test.go.
#
# It prints, for each path, the times and kube-controller-manager's CPU per attach+detach; flexd's
# controller CPU per attach+detach and its peak RSS; then two lines, "attach, ..." and
# "detach, ...", with flexd's time over kube-controller-manager's (`... 1.10x`).
#
# The scenario (the client) runs at the least CPU weight (as_remote_client in cluster.sh).
# E2E_KCM_API_QPS=100 gives kube-controller-manager that client rate (its own default is 20):
# the CSI path costs it one more API write per attach and per detach (the VolumeAttachment).
#
# Usage: bench/attach-scale.sh [NODES=50] [VOLUMES=200]
# FLEXD=path/to/flexd uses that binary (default: cargo build --release -p flexd).
set -euo pipefail
NODES=${1:-50}
VOLUMES=${2:-200}
export E2E_NAME=${E2E_NAME:-flexd-bench}
# shellcheck source=tests/e2e/run.sh
. "$(dirname "$0")/../tests/e2e/run.sh"
trap 'leave_client_cgroup; down >/dev/null 2>&1 || true' EXIT
up_deployed
# The scenario's 200 pods at once and its polling come as from off the node.
as_remote_client
scenarios attach_scale E2E_ATTACH_NODES="$NODES" E2E_ATTACH_VOLUMES="$VOLUMES"
[ "$failed" = 0 ] || die "the attach bench failed (logs in $D/logs)"
cat "$D/logs/scenario-attach_scale.summary"
