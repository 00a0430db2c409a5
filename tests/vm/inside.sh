#!/usr/bin/env bash
# Runs inside the VM that tests/vm/run.sh boots: checks that this is cgroup v2 only with the
# pids controller, then runs each test binary listed in $1/binaries, writing
# "<label> <exit status> <passed> <failed> <ignored> <seconds>" lines to $1/results and each
# binary's output to $1/logs/<label>.log.
#
# The flexvolume-host suites run one after the other in one cgroup, as flexd runs in a container or
# a service: alone in its cgroup, so it moves into its `flexd-daemon` leaf to cap drivers below
# it, and each suite after the first is a flexd restarted in a cgroup an earlier one prepared.
# The other suites start flexd processes beside the test harness, so they run in the root
# cgroup, where flexd caps its drivers without moving.
set -uo pipefail
out=$1
: >"$out/started"
# shellcheck source=/dev/null
. "$out/env"
mkdir -p "$out/logs"
: >"$out/results"
fail_check() {
  echo "vm check FAILED: $*"
  echo "$*" >>"$out/check.failed"
}

uname -r | tee "$out/uname"
echo "vm: cgroup mounts:"
grep -E ' - cgroup2? ' /proc/self/mountinfo | sed 's/^/  /'
grep -qE ' - cgroup ' /proc/self/mountinfo && fail_check "a cgroup v1 hierarchy is mounted: not a cgroup v2 only host"
grep -qE '^[0-9]+ [0-9]+ [^ ]+ / /sys/fs/cgroup .* - cgroup2 ' /proc/self/mountinfo ||
  fail_check "cgroup2 is not mounted at /sys/fs/cgroup"
echo "vm: controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
grep -qw pids /sys/fs/cgroup/cgroup.controllers || fail_check "the pids controller is not available"
case "$(uname -r)" in 6.1.*) ;; *) fail_check "kernel $(uname -r) is not 6.1" ;; esac
echo +pids >/sys/fs/cgroup/cgroup.subtree_control || fail_check "cannot enable pids below the root cgroup"

# Scratch on a tmpfs of the VM: the host's files come over 9p, which cannot hold FIFOs.
mkdir -p /run/flexd-vm-tmp && mount -t tmpfs -o size=2G,mode=1777 flexd-vm-tmp /run/flexd-vm-tmp
export TMPDIR=/run/flexd-vm-tmp
# Tests that do not depend on the kernel and are slow under emulation (checkov) skip here; the
# host's cargo test runs them.
export FLEXD_IN_VM=1
modprobe -q loop 2>/dev/null
modprobe -q xfs 2>/dev/null
modprobe -q ext4 2>/dev/null
[ -e /dev/loop-control ] || fail_check "no loop devices (modprobe loop failed)"

# Executables run from memory: exec over 9p reads the whole file again each time (about 2 s
# for flexd's debug build, 0.25 s from a tmpfs), which the suites that start flexd hundreds of
# times would pay. Each is copied to a tmpfs and bind-mounted over its path, which the tests
# have compiled in.
mkdir -p /run/flexd-vm-bin && mount -t tmpfs -o mode=755 flexd-vm-bin /run/flexd-vm-bin
i=0
while read -r exe; do
  i=$((i + 1))
  cp "$exe" "/run/flexd-vm-bin/$i" && mount --bind "/run/flexd-vm-bin/$i" "$exe" ||
    fail_check "cannot copy $exe to memory"
done <"$out/executables"

if [ -n "${FLEXD_VM_EXEC:-}" ]; then
  bash -c "$FLEXD_VM_EXEC"
  echo $? >"$out/exec.status"
  exit 0
fi

# Each line: label, executable, its package dir, and the test-name filters to run (none: all).
while read -r label exe cwd filters; do
  log="$out/logs/$label.log"
  mkdir -p "$(dirname "$log")"
  cgroup=
  case "$label" in
    flexvolume-host/*)
      cgroup=/sys/fs/cgroup/vm-flexvolume
      mkdir -p "$cgroup"
      ;;
  esac
  echo "vm: running $label"
  start=$(date +%s)
  (
    cd "$cwd" || exit 101
    [ -n "$cgroup" ] && echo "$BASHPID" >"$cgroup/cgroup.procs"
    # shellcheck disable=SC2086 # the filters are words
    exec "$exe" --nocapture $filters
  ) >"$log" 2>&1
  status=$?
  secs=$(($(date +%s) - start))
  count() { grep -E '^test result:' "$log" | grep -oE "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
  echo "$label $status $(count passed) $(count failed) $(count ignored) $secs" | tee -a "$out/results"
  grep -E '^skipped:' "$log" | sort | uniq -c | sed 's/^/    /'
  # Every suite runs with the process cap: none may find it unavailable.
  grep -qE 'no process cap on this machine|drivers run without a process cap' "$log" &&
    fail_check "$label: the process cap was unavailable: $(grep -m1 -oE '(no process cap on this machine|reason=).*' "$log")"
  case "$label" in
    flexvolume-host/integration*)
      # (The hostile module is in the library's one integration binary.)
      # The cap must have been exercised, not skipped: the fork bomb test ran its capped path,
      # and flexd, alone in its cgroup, moved into its leaf to enable pids below it.
      grep -q '^skipped: .*process cap\|^skipped: needs root' "$log" &&
        fail_check "hostile: the process cap tests skipped"
      grep -q '^test hostile::a_fork_bomb_is_held_to_the_process_cap_and_killed_at_the_timeout \.\.\. ok' "$log" ||
        fail_check "hostile: the fork bomb test did not pass"
      [ -d "$cgroup/flexd-daemon" ] && [ -d "$cgroup/flexd-callouts" ] ||
        fail_check "hostile: flexd did not move into $cgroup/flexd-daemon with call-outs in $cgroup/flexd-callouts"
      grep -qw pids "$cgroup/flexd-callouts/cgroup.subtree_control" ||
        fail_check "hostile: pids is not enabled for the call-out cgroups"
      ;;
  esac
done <"$out/binaries"
sync
