#!/usr/bin/env bash
# flexd on a real Kubernetes cluster, as root (one node by default; .ci/run runs E2E_NODES=3):
# cluster.sh brings the cluster up and down, the scenarios are Go tests (scenarios/, one file
# per concern).
#
#   tests/e2e/run.sh up      the cluster, flexd deployed by its own manifests with the builtin loop
#                            driver, and the operator guide's example (examples/kubernetes/
#                            loop-app.yaml) Running; prints how to look around and tear down
#   tests/e2e/run.sh down    stop and remove everything `up` made (idempotent)
#   tests/e2e/run.sh         up, every scenario, down (always); last line `N passed, M failed`
#   tests/e2e/run.sh test    the scenarios against a cluster that is up
#
# E2E_NODES=3 brings up (and tests) three nodes instead of one: cluster.sh's node table; `test`
# needs the E2E_NODES (and E2E_PLUGIN_DIR) the cluster was brought up with.
# E2E_SCENARIOS="deploy inline" runs those only (in the suite's order; deploy first: the others
# need flexd deployed); E2E_KEEP=1 leaves the cluster up at the end. A failed run keeps its logs
# in $E2E_DIR.logs; E2E_REPORT_DIR=DIR also copies the scenarios' Ginkgo report and summaries
# there (matrix.sh reads them). E2E_KUBERNETES=1.29 runs that Kubernetes minor instead of the one
# tests/e2e/go.mod pins (tools.sh; pins in kubernetes/). The rest of the environment (E2E_NAME,
# E2E_DIR, E2E_PLUGIN_DIR, FLEXD): cluster.sh.
set -euo pipefail
# shellcheck source=tests/e2e/cluster.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh"

SCENARIOS=${E2E_SCENARIOS:-deploy preflight static_pv inline fsgroup migrate installer faults_pod faults_kubelet faults_node storage example nodes multiattach discovery oracle migrate_apply migrate_rolling nodeloss reconciler upgrade rollout failover fence controller uninstall}

# scenarios LABEL-FILTER [ENV...]: the Go scenarios of the filter, in the cluster's network
# namespace; counts the specs that passed and failed into $passed and $failed.
scenarios() {
  local filter=$1 report=$D/logs/scenarios.json status; shift
  rm -f "$report"
  set +e
  # The nodes, node 0 first: names, addresses, own dirs (see cluster.sh's node table).
  local i names=() ips=() dirs=()
  for i in $(node_indexes); do names+=("$(node_name $i)") ips+=("$(node_ip $i)") dirs+=("$(node_dir $i)"); done
  [ "$(cat "$D/run/nodes" 2>/dev/null)" = "$E2E_NODES" ] ||
    die "the cluster in $D has $(cat "$D/run/nodes" 2>/dev/null || echo no) node(s) recorded, E2E_NODES says $E2E_NODES"
  same_plugin_dir
  env E2E_DIR="$D" E2E_NODE=$NODE E2E_NODE_IP=$NODE_IP E2E_NAMESPACE=$NAMESPACE E2E_DRIVER=$DRIVER \
    E2E_NODES=$E2E_NODES E2E_NODE_NAMES="${names[*]}" E2E_NODE_IPS="${ips[*]}" E2E_NODE_DIRS="${dirs[*]}" \
    E2E_SHARED_DIR="$D/loop-images" E2E_PLUGIN_DIR="$PLUGIN_DIR" \
    E2E_CSI_NAME=$CSI_NAME E2E_FLEXD_IMAGE=$FLEXD_IMAGE E2E_FLEXD_PREVIOUS_IMAGE=$FLEXD_PREVIOUS_IMAGE \
    E2E_TOOLS_IMAGE=$TOOLS_IMAGE \
    E2E_INSTALLER_IMAGE=$INSTALLER_IMAGE E2E_SIDECAR_IMAGE_FLAGS="${SIDECAR_IMAGES[*]}" \
    E2E_REPO="$repo" E2E_NAME="$E2E_NAME" E2E_DIR="$D" "$@" \
    nsenter --net=/run/netns/$NETNS "$D/bin/scenarios.test" -test.timeout 0 \
    -ginkgo.label-filter "$filter" -ginkgo.timeout 3h -ginkgo.no-color -ginkgo.v \
    -ginkgo.json-report "$report" 2>&1 | tee "$D/logs/scenarios.log" >&2
  status=${PIPESTATUS[0]}
  set -e
  # A spec filtered out is "skipped"; one that could not finish (timed out, panicked, ...) failed.
  passed=$((passed + $(jq '[.[].SpecReports[]? | select(.LeafNodeType == "It" and .State == "passed")] | length' "$report" 2>/dev/null || echo 0)))
  failed=$((failed + $(jq '[.[].SpecReports[]? | select(.State != "passed" and .State != "skipped" and .State != "pending")] | length' "$report" 2>/dev/null || echo 1)))
  # Summaries the scenarios write (the storage suite's counts, the oracle's report), shown
  # whatever the outcome.
  local summary
  for summary in "$D"/logs/scenario-*.summary; do
    [ -f "$summary" ] || continue
    log "$(basename "$summary" .summary):"
    sed 's/^/    /' "$summary" >&2
  done
  if [ "$status" != 0 ] && [ "$failed" = 0 ]; then failed=1; log "FAIL: the scenarios exited $status"; fi
  # For matrix.sh: the report and the summaries, kept past `down`.
  if [ -n "${E2E_REPORT_DIR:-}" ]; then
    mkdir -p "$E2E_REPORT_DIR"
    cp "$report" "$E2E_REPORT_DIR/" 2>/dev/null || true
    cp "$D"/logs/scenario-*.summary "$E2E_REPORT_DIR/" 2>/dev/null || true
  fi
}

run_scenarios() {
  local names
  read -r -a names <<<"$SCENARIOS"
  passed=0 failed=0
  scenarios "$(IFS='|'; echo "${names[*]}" | sed 's/|/ || /g')"
}

# `up` for a person: the cluster, then the example scenario, kept, and how to look around.
up_to_try() {
  up
  passed=0 failed=0
  log "up: flexd with the loop driver, and the operator guide's example (the example scenario)"
  # Its spec-by-spec output is in $D/logs/scenarios.log.
  scenarios example E2E_EXAMPLE_KEEP=1 2>/dev/null
  [ "$failed" = 0 ] || die "the example did not come up: $D/logs/scenarios.log says why"
  cat >&2 <<EOT

flexd is deployed in $NAMESPACE with the loop driver, and the operator guide's example
(examples/kubernetes/loop-app.yaml) is Running. The API server is in the network namespace
$NETNS; look around with:

  alias k='nsenter --net=/run/netns/$NETNS $D/bin/kube kubectl --kubeconfig=$D/kubeconfig'
  k get pods -A
  k logs flexd-example
  k -n $NAMESPACE logs daemonset/flexd-node -c flexd

and remove everything with: tests/e2e/run.sh down
EOT
}

# up_deployed: for the benchmarks (bench/), which source this file: `up`, then flexd deployed as
# the deploy scenario deploys it (and checks it), or die.
up_deployed() {
  up >&2
  passed=0 failed=0
  scenarios deploy
  [ "$failed" = 0 ] || die "flexd did not deploy (logs in $D/logs)"
}

finish() {
  local status=$?
  if [ "${E2E_KEEP:-}" = 1 ]; then
    log "E2E_KEEP=1: the cluster stays up; tests/e2e/run.sh down removes it"
  else
    # Keep the logs of a failed run next to the scratch dir.
    if [ "${failed:-0}" != 0 ] || [ $status != 0 ]; then
      rm -rf "$D.logs" && cp -r "$D/logs" "$D.logs" 2>/dev/null && log "logs kept in $D.logs" || true
      cp -r "$D/run" "$D.logs/run" 2>/dev/null || true
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

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-all}" in
  up) up_to_try ;;
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
    # A command that stops `up` is named: its own message may be lost in a daemon's log. (The
    # ERR trap also fires in command substitutions, whose failures do not stop `up`: it only
    # remembers, and the EXIT trap tells.)
    (set -Eeuo pipefail
      stopped_at=unknown
      trap 'stopped_at="${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND"' ERR
      trap 'status=$?; [ $status = 0 ] || log "ERROR: up stopped (exit $status) at $stopped_at"' EXIT
      up) >&2
    status=$?
    set -e
    if [ $status = 0 ]; then
      run_scenarios
    else
      failed=1; log "FAIL: the cluster did not come up (logs in $D/logs)"
    fi ;;
  *) echo "usage: $0 [up|down|test]" >&2; exit 2 ;;
esac
