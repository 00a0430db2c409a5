#!/usr/bin/env bash
# Builds a Go tool pinned by this directory's go.mod/go.sum (from the Go module proxy) and prints
# its path. Built once per machine and pin: the binary is cached under
# ${FLEXD_TOOLS_CACHE:-~/.cache/flexd-tools}/<hash of go.mod and go.sum>/, so a changed pin
# rebuilds and an unchanged one costs nothing.
#
#   tests/e2e/tools.sh csi-sanity     # the CSI conformance suite (kubernetes-csi/csi-test)
#   tests/e2e/tools.sh kube           # etcd and Kubernetes in one multi-call binary (cmd/kube)
#   tests/e2e/tools.sh storage-e2e    # Kubernetes' storage e2e suite for external drivers
#                                     # (cmd/storage-e2e, a `go test -c` binary)
#   tests/e2e/tools.sh ginkgo         # Ginkgo's CLI, which runs that suite's specs in parallel
#   tests/e2e/tools.sh agnhost        # Kubernetes' e2e test image binary, for that suite's pods
#   tests/e2e/tools.sh csi-provisioner|csi-attacher|csi-resizer
#                                     # the CSI sidecars, each from its own module under
#                                     # sidecars/ (upstream's replace directives copied there)
#
# Everything is built with CGO_ENABLED=0, linked statically: the sidecars and agnhost go into
# container images that hold nothing else, and kube and storage-e2e, built with the same setting,
# share every compiled package of Kubernetes in Go's build cache (a cgo setting of its own made
# kube compile them all a second time, most of a cold build).
#
# Exit status: 0 and the path on stdout; 1 with the reason on stderr (no Go, build failed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

declare -A packages=(
  [csi-sanity]=github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
  [kube]=./cmd/kube
  [storage-e2e]=./cmd/storage-e2e
  [ginkgo]=github.com/onsi/ginkgo/v2/ginkgo
  [agnhost]=k8s.io/kubernetes/test/images/agnhost
  [csi-provisioner]=github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
  [csi-attacher]=github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
  [csi-resizer]=github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer
)
tool=${1:?usage: tools.sh TOOL (one of: ${!packages[*]})}
package=${packages[$tool]:-}
[ -n "$package" ] || { echo "tools.sh: unknown tool $tool (one of: ${!packages[*]})" >&2; exit 1; }
# The module that pins it: this directory's, or for a sidecar its own.
module=$here
case $tool in csi-provisioner | csi-attacher | csi-resizer) module=$here/sidecars/$tool ;; esac

if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then
    PATH=/usr/local/go/bin:$PATH
  else
    echo "tools.sh: no Go toolchain (go on PATH or /usr/local/go/bin/go): cannot build $tool" >&2
    exit 1
  fi
fi

# Kubernetes' version is stamped at link time (else every component says v0.0.0-master): the
# pinned k8s.io/kubernetes version, as its own release build does.
ldflags=
if [ "$tool" = kube ]; then
  version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
  major=${version#v}; major=${major%%.*}
  minor=${version#v$major.}; minor=${minor%%.*}
  ldflags="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
fi

# The pin: the module's requirements, the link flags, and for a command of this module its own
# source too.
pin=$( (cat "$module/go.mod" "$module/go.sum" $(case $package in ./*) find "$module/${package#./}" -name '*.go' | sort ;; esac)
  echo "$tool cgo=0 $ldflags") | sha256sum | cut -c1-16)
cache=${FLEXD_TOOLS_CACHE:-${HOME:-/root}/.cache/flexd-tools}/$pin
binary=$cache/$tool
if [ ! -x "$binary" ]; then
  mkdir -p "$cache"
  echo "tools.sh: building $tool from $package (pinned in tests/e2e/go.mod) into $cache" >&2
  # A temporary name, then a rename: a build that is interrupted leaves no half binary.
  if [ "$tool" = storage-e2e ]; then
    (cd "$module" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go test -c -o "$binary.partial.$$" "$package") >&2
  else
    (cd "$module" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -ldflags "$ldflags" -o "$binary.partial.$$" "$package") >&2
  fi
  mv -f "$binary.partial.$$" "$binary"
fi
echo "$binary"
