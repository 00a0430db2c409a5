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
#   tests/e2e/tools.sh build-tags     # the Go build tags for E2E_KUBERNETES (below)
#   tests/e2e/tools.sh goflags        # the GOFLAGS every Go build of the e2e uses (below)
#
# E2E_KUBERNETES=1.MINOR builds kube, storage-e2e and ginkgo for that Kubernetes minor instead
# of the one go.mod pins: from kubernetes/v1.MINOR.mod (written by kubernetes/pin.sh) with
# `go build -modfile`, the same sources, and build tags that pick each side of an API that
# changed: before_1_N for every N above the minor up to go.mod's, since_1_N for every N above
# go.mod's up to the minor (none for go.mod's own minor, so plain `go build` and `go vet` see it).
#
# Everything is built with CGO_ENABLED=0, linked statically: the sidecars and agnhost go into
# container images that hold nothing else, and kube and storage-e2e, built with the same setting,
# share every compiled package of Kubernetes in Go's build cache (a cgo setting of its own made
# kube compile them all a second time, most of a cold build).
#
# And without DWARF, from the compiler (-gcflags=all=-dwarf=false) and the linker (-w): nothing
# runs these under a debugger (a panic's stack trace comes from the symbol table, which stays),
# and a cold build takes 17% less CPU. Every Go build of the e2e (the scenarios in cluster.sh,
# .ci/run's prebuild) uses the same GOFLAGS, so that they share compiled packages with the tools.
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
tool=${1:?usage: tools.sh TOOL (one of: build-tags goflags ${!packages[*]})}
goflags="-mod=readonly -gcflags=all=-dwarf=false -ldflags=-w"
if [ "$tool" = goflags ]; then echo "$goflags"; exit 0; fi

# The minor go.mod pins, and the one asked for.
pinned=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
pinned_minor=${pinned#v1.}; pinned_minor=${pinned_minor%%.*}
minor=${E2E_KUBERNETES:-1.$pinned_minor}
[[ $minor =~ ^1\.([0-9]+)$ ]] || { echo "tools.sh: E2E_KUBERNETES=$minor is not a Kubernetes minor (like 1.29)" >&2; exit 1; }
minor=${BASH_REMATCH[1]}
modfile=
if [ "$minor" != "$pinned_minor" ]; then
  modfile=$here/kubernetes/v1.$minor.mod
  [ -f "$modfile" ] || { echo "tools.sh: no pins for Kubernetes 1.$minor (tests/e2e/kubernetes/v1.$minor.mod; write them with kubernetes/pin.sh)" >&2; exit 1; }
fi
tags=
for ((n = minor + 1; n <= pinned_minor; n++)); do tags="$tags,before_1_$n"; done
for ((n = pinned_minor + 1; n <= minor; n++)); do tags="$tags,since_1_$n"; done
tags=${tags#,}
if [ "$tool" = build-tags ]; then echo "$tags"; exit 0; fi

package=${packages[$tool]:-}
[ -n "$package" ] || { echo "tools.sh: unknown tool $tool (one of: ${!packages[*]})" >&2; exit 1; }
# The module that pins it: this directory's, or for a sidecar its own.
module=$here
modfile_flag=
case $tool in
  csi-provisioner | csi-attacher | csi-resizer)
    module=$here/sidecars/$tool tags= modfile=
    # The sidecar versions for that minor, as `flexd manifests --kubernetes-version` chooses
    # them: csi-provisioner v6 needs storage.k8s.io/v1 VolumeAttributesClass, csi-resizer v2
    # the claims' allocatedResourceStatuses (both 1.34).
    if [ "$tool" = csi-provisioner ] && [ "$minor" -lt 34 ]; then
      module=$here/sidecars/csi-provisioner-v5
      package=github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner
    fi
    if [ "$tool" = csi-resizer ] && [ "$minor" -lt 34 ]; then
      module=$here/sidecars/csi-resizer-v1
      package=github.com/kubernetes-csi/external-resizer/cmd/csi-resizer
    fi
    ;;
  kube | storage-e2e | ginkgo) [ -z "$modfile" ] || modfile_flag=-modfile=$modfile ;;
  *) tags= modfile= ;;
esac

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
# -w as GOFLAGS says: an -ldflags given on the command line replaces GOFLAGS' own.
ldflags=-w
if [ "$tool" = kube ]; then
  version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "${modfile:-$here/go.mod}")
  major=${version#v}; major=${major%%.*}
  minor=${version#v$major.}; minor=${minor%%.*}
  ldflags="$ldflags -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
fi

# The pin: the module's requirements, the link flags, and for a command of this module its own
# source too.
# A release that needs a newer Go than this machine's says so in its pins; the go command fetches
# that toolchain from the module proxy.
gomodfile=${modfile:-$module/go.mod}
case $(awk '$1 == "go" {print $2; exit}' "$gomodfile") in 1.2[7-9]* | 1.[3-9]*) export GOTOOLCHAIN=go1.27.3 ;; esac
pin=$( (cat "$gomodfile" "${gomodfile%.mod}.sum" $(case $package in ./*) find "$module/${package#./}" -name '*.go' | sort ;; esac)
  echo "$tool cgo=0 $goflags $ldflags${tags:+ tags=$tags}") | sha256sum | cut -c1-16)
cache=${FLEXD_TOOLS_CACHE:-${HOME:-/root}/.cache/flexd-tools}/$pin
binary=$cache/$tool
if [ ! -x "$binary" ]; then
  mkdir -p "$cache"
  echo "tools.sh: building $tool from $package (Kubernetes 1.$minor; pinned in tests/e2e/${gomodfile#$here/}) into $cache" >&2
  # A shared lock while building, so that the emptying below never pulls the cache from under
  # another tools.sh's build (.ci/run builds csi-sanity beside its prebuild).
  lock=${FLEXD_TOOLS_CACHE:-${HOME:-/root}/.cache/flexd-tools}/.gocache.lock
  exec {lock_fd}>"$lock"
  flock -s "$lock_fd"
  # A temporary name, then a rename: a build that is interrupted leaves no half binary.
  if [ "$tool" = storage-e2e ]; then
    (cd "$module" && CGO_ENABLED=0 GOFLAGS=$goflags go test -c $modfile_flag -tags "$tags" -o "$binary.partial.$$" "$package") >&2
  else
    (cd "$module" && CGO_ENABLED=0 GOFLAGS=$goflags go build $modfile_flag -tags "$tags" -ldflags "$ldflags" -o "$binary.partial.$$" "$package") >&2
  fi
  mv -f "$binary.partial.$$" "$binary"
  # Go's build cache only drops what went unused for days, and each Kubernetes minor adds several
  # GiB of it: past FLEXD_GOCACHE_MAX_GIB (12) it is emptied once a build is done (the binaries
  # stay cached here), so that building minor after minor does not fill the disk the e2e runs on.
  gocache=$(go env GOCACHE)
  if [ -d "$gocache" ] && (($(du -sk "$gocache" | cut -f1) > ${FLEXD_GOCACHE_MAX_GIB:-12} * 1024 * 1024)) &&
    flock -x -n "$lock_fd"; then
    echo "tools.sh: Go's build cache $gocache is over ${FLEXD_GOCACHE_MAX_GIB:-12} GiB: emptying it (go clean -cache)" >&2
    go clean -cache
  fi
fi
echo "$binary"
