#!/usr/bin/env bash
# Runs the workspace's kernel-facing tests inside a VM on Debian 12's kernel 6.1 with cgroup v2
# as the only hierarchy: what most Kubernetes nodes run, and what a hybrid host with a newer
# kernel cannot show (flexd's v2 process cap, its move into a `flexd-daemon` leaf, `cgroup.kill`,
# the pre-6.6 fchmodat2 fallback, loop devices and mounts on an older kernel).
#
# Which tests: every suite of the crates that meet the kernel (flexvolume-os, flexvolume-host,
# flexvolume-loop, flexvolume-driver), and of flexd's integration suite the modules that mount,
# own, set up loop devices or cap drivers (VM_FLEXD_MODULES below). The rest (protocol parsing,
# manifests, the CLI reference, csi-sanity's gRPC) behaves the same on any kernel: the host's
# `cargo test` runs it, and under emulation it would triple the VM's time.
#
# The binaries are built on the host; the VM (virtme-ng, QEMU without KVM) sees the host's files
# read-only and runs tests/vm/inside.sh. Exits 0 with a "VM suite SKIPPED: <reason>" line when
# the VM cannot run here (not root, packages cannot be installed, the VM does not boot); exits
# non-zero when the VM ran and a test failed.
#
# Environment: FLEXD_VM_TIMEOUT (seconds for the whole VM, default 2400), FLEXD_VM_CPUS (2),
# FLEXD_VM_MEMORY (6G), FLEXD_SOAK_SECS (10), FLEXD_VM_EXEC (a command to run in the VM
# instead of the tests, with the same set-up; for benchmarks).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

skip() {
  echo "VM suite SKIPPED: $*"
  exit 0
}

[ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ] || skip "needs Linux on x86_64"
[ "$(id -u)" -eq 0 ] || skip "needs root (tests mount, use loop devices and cgroups)"

# What the VM needs, installed when missing (quiet, idempotent).
kernel() { compgen -G '/boot/vmlinuz-6.1.*' | sort -V | tail -n 1; }
if ! command -v qemu-system-x86_64 >/dev/null || [ -z "$(kernel)" ] || ! command -v busybox >/dev/null; then
  command -v apt-get >/dev/null || skip "qemu-system-x86, a 6.1 kernel or busybox is missing and there is no apt-get"
  echo "vm: installing qemu-system-x86 linux-image-amd64 busybox-static"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      qemu-system-x86 linux-image-amd64 busybox-static; } >/tmp/flexd-vm-apt.log 2>&1 ||
    skip "cannot install the VM's packages (no network?), see /tmp/flexd-vm-apt.log"
fi
if ! command -v vng >/dev/null; then
  command -v pip >/dev/null || command -v pip3 >/dev/null || skip "virtme-ng is missing and there is no pip"
  echo "vm: installing virtme-ng"
  { pip install -q virtme-ng || pip3 install -q --break-system-packages virtme-ng; } \
    >/tmp/flexd-vm-pip.log 2>&1 || skip "cannot install virtme-ng (no network?), see /tmp/flexd-vm-pip.log"
  hash -r
  command -v vng >/dev/null || skip "virtme-ng installed, but vng is not on PATH"
fi
vmlinuz=$(kernel)
[ -n "$vmlinuz" ] || skip "no /boot/vmlinuz-6.1.* after installing linux-image-amd64 (not Debian 12?)"

# The test binaries, built on the host: "<crate>/<target>[<kind>] <executable> <cwd>" per line,
# cwd being the package's directory, as cargo test runs them; and every executable built (the
# tests run flexd and flexd-loop from target/), which the VM copies to memory.
work=$(mktemp -d /tmp/flexd-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "vm: building the test binaries on the host"
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$work/build.json"
VM_KERNEL_CRATES="flexvolume-os flexvolume-host flexvolume-loop flexvolume-driver"
VM_FLEXD_MODULES="ephemeral install loop_driver mount_namespace ownership provision serve volume"
VM_KERNEL_CRATES=$VM_KERNEL_CRATES VM_FLEXD_MODULES=$VM_FLEXD_MODULES \
python3 - "$work/build.json" "$work/binaries" "$work/executables" <<'EOF'
import json, os, sys
KERNEL_CRATES = os.environ["VM_KERNEL_CRATES"].split()
FLEXD_MODULES = os.environ["VM_FLEXD_MODULES"].split()
tests, executables = [], []
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if not exe or exe in executables:
        continue
    executables.append(exe)
    if m["profile"]["test"]:
        package = os.path.basename(os.path.dirname(m["manifest_path"]))
        label = "%s/%s[%s]" % (package, m["target"]["name"], m["target"]["kind"][0])
        if package in KERNEL_CRATES:
            tests.append((label, exe, os.path.dirname(m["manifest_path"]), ""))
        elif label == "flexd/integration[test]":
            filters = " ".join(m + "::" for m in FLEXD_MODULES)
            tests.append((label, exe, os.path.dirname(m["manifest_path"]), filters))
# The library's suites first: they are what the VM is for (the process cap on cgroup v2).
tests.sort(key=lambda t: not t[0].startswith("flexvolume-host/"))
with open(sys.argv[2], "w") as out:
    out.writelines("%s %s %s %s\n" % t for t in tests)
with open(sys.argv[3], "w") as out:
    out.writelines(e + "\n" for e in executables)
EOF
echo "vm: $(wc -l <"$work/binaries") test binaries"

# What the tests need from the host's environment (the VM starts with a bare one).
{
  for var in PATH HOME CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN RUSTC; do
    [ -n "${!var:-}" ] && printf 'export %s=%q\n' "$var" "${!var}"
  done
  printf 'export FLEXD_SOAK_SECS=%q\n' "${FLEXD_SOAK_SECS:-10}"
  printf 'export RUST_BACKTRACE=1\n'
  [ -n "${FLEXD_VM_EXEC:-}" ] && printf 'export FLEXD_VM_EXEC=%q\n' "$FLEXD_VM_EXEC"
} >"$work/env"

echo "vm: booting $vmlinuz (QEMU without KVM: slow, be patient)"
started=$(date +%s)
set +e
timeout --kill-after=30 "${FLEXD_VM_TIMEOUT:-2400}" vng --run "$vmlinuz" --user root --disable-kvm \
  --cpus "${FLEXD_VM_CPUS:-2}" --memory "${FLEXD_VM_MEMORY:-6G}" --rwdir "$work" --cwd "$repo" \
  --exec "bash $repo/tests/vm/inside.sh $work" </dev/null 2>&1 | tee "$work/console.log" |
  grep --line-buffered -v '^\s*$'
vng_status=${PIPESTATUS[0]}
set -e
elapsed=$(($(date +%s) - started))
echo "vm: the VM ran ${elapsed}s (vng exit status $vng_status)"

if [ ! -e "$work/started" ]; then
  tail -n 20 "$work/console.log" | sed 's/^/vm console: /'
  # The VM booted and ran bash, which found no inside.sh: the checkout is not visible in the VM
  # (seen for one under /var/tmp, which virtme-ng does not share). A failure, never a skip: the
  # suite would silently not run.
  if [ "$vng_status" = 127 ] || grep -q "tests/vm/inside.sh: No such file" "$work/console.log"; then
    echo "vm: the VM booted but does not see the checkout at $repo: run from a checkout outside /tmp and /var/tmp" >&2
    exit 1
  fi
  skip "the VM did not boot (vng exit status $vng_status)"
fi
[ -n "${FLEXD_VM_EXEC:-}" ] && exit "$(cat "$work/exec.status" 2>/dev/null || echo 1)"

failed_checks=$(cat "$work/check.failed" 2>/dev/null || true)
passed=0
failed=0
bad_binaries=0
echo "vm: per binary (tests passed / failed / ignored, seconds):"
while read -r label _; do
  result=$(grep -F "$label " "$work/results" 2>/dev/null | tail -n 1 || true)
  if [ -z "$result" ]; then
    echo "  NOT RUN  $label"
    bad_binaries=$((bad_binaries + 1))
    failed=$((failed + 1)) # counted as one failure, so the summary never reads "0 failed"
    continue
  fi
  read -r _ status p f i secs <<<"$result"
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$status" != 0 ]; then
    bad_binaries=$((bad_binaries + 1))
    [ "$f" -eq 0 ] && failed=$((failed + 1)) # crashed or timed out without a failed test
    printf '  FAILED   %-45s %4s / %s / %s  %4ss  (exit %s)\n' "$label" "$p" "$f" "$i" "$secs" "$status"
    # Each failure's line and the panic's message after it: the log itself stays in the VM's
    # work dir, which only the machine that ran it keeps.
    awk '/^(test .* FAILED|---- )|panicked at/ { print; after = 3; next } after > 0 { print; after-- }' \
      "$work/logs/$label.log" 2>/dev/null | head -n 30 | sed 's/^/      /' || true
  else
    printf '  ok       %-45s %4s / %s / %s  %4ss\n' "$label" "$p" "$f" "$i" "$secs"
  fi
done <"$work/binaries"
if [ -n "$failed_checks" ]; then
  echo "vm: checks failed in the VM:"
  sed 's/^/  /' <<<"$failed_checks"
fi
if [ "$bad_binaries" -gt 0 ] || [ -n "$failed_checks" ]; then
  keep=/tmp/flexd-vm-logs
  rm -rf "$keep" && cp -r "$work" "$keep" && echo "vm: logs kept in $keep"
fi
echo "vm: kernel $(cat "$work/uname" 2>/dev/null), ${elapsed}s in the VM"
echo "vm: $passed passed, $failed failed"
[ "$bad_binaries" -eq 0 ] && [ -z "$failed_checks" ]
