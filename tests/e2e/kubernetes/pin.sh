#!/usr/bin/env bash
# Writes the pins of one Kubernetes release for the e2e: kubernetes/v1.MINOR.mod and .sum, an
# alternative go.mod for tests/e2e that tools.sh builds with (`go build -modfile=...`), so the
# same sources (cmd/kube, cmd/storage-e2e) build that release's control plane, kubelet and
# storage suite. etcd, Ginkgo and Gomega are the versions that release itself requires.
#
#   tests/e2e/kubernetes/pin.sh v1.29.15
#
# The module proxy serves k8s.io/kubernetes only at exact versions, and not every staging module
# (k8s.io/api, k8s.io/kubelet, ...) at every patch release: a staging module missing at the
# release's own v0 version is taken at the newest patch of the same minor that is served, and
# the file says which.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:?usage: pin.sh v1.MINOR.PATCH (a k8s.io/kubernetes release)}
[[ $version =~ ^v1\.([0-9]+)\.[0-9]+(-[a-z]+\.[0-9]+)?$ ]] || { echo "pin.sh: $version is not a Kubernetes release (v1.MINOR.PATCH)" >&2; exit 1; }
minor=${BASH_REMATCH[1]}
staging=v0.${version#v1.}
command -v go >/dev/null || PATH=/usr/local/go/bin:$PATH
# A release that needs a newer Go than this machine's names it in its go.mod; the go command
# fetches that toolchain from the module proxy (tools.sh does the same).
godirective() { awk '$1 == "go" {print $2; exit}' "$1"; }
# The module's go.mod, once the whole module is downloaded (the proxy may serve a version's
# go.mod and refuse its source).
download() { (go mod download -json "$1" 2>/dev/null || true) | awk -F'"' '$2 == "Error" {exit} $2 == "GoMod" {m = $4} $2 == "Zip" {z = 1} END {if (z) print m}'; }
# Its go.mod first (served even where this Go is too old for the module), for the Go it needs.
gomod=$( (go mod download -json "k8s.io/kubernetes@$version" 2>/dev/null || true) | awk -F'"' '$2 == "GoMod" {print $4}')
[ -f "$gomod" ] || { echo "pin.sh: the module proxy has no k8s.io/kubernetes@$version" >&2; exit 1; }
godir=$(godirective "$gomod")
case $godir in 1.2[7-9]* | 1.[3-9]*) export GOTOOLCHAIN=go1.27.3 ;; esac
[ -n "$(download "k8s.io/kubernetes@$version")" ] || { echo "pin.sh: the module proxy does not serve k8s.io/kubernetes@$version's source" >&2; exit 1; }
required() { awk -v m="$1" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$gomod"; }
out=$here/v1.$minor.mod
replaces= notes= skipped=
for module in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod" | sort -u); do
  case $module in k8s.io/sample-*) continue ;; esac # examples, never imported
  at=$staging
  if [ -z "$(download "$module@$staging")" ]; then
    at=$( (go list -m -versions "$module" 2>/dev/null || true) | tr ' ' '\n' | { grep "^v0\.$minor\.[0-9]*$" || true; } | sort -V | tail -1)
    if [ -z "$at" ]; then
      # Left out: if what the e2e builds imports it, resolving below fails and names it.
      skipped="$skipped ${module#k8s.io/}"
      continue
    fi
    notes="$notes ${module#k8s.io/}@$at"
  fi
  replaces="$replaces	$module => $module $at
"
done
# A module the release requires whose source the proxy does not serve (its go.mod only) is built
# from a stand-in of ours beside this script, a directory holding that module's go.mod, if there
# is one (iptables-wrappers, which kubelet 1.38 imports); else resolving below fails and names it.
standins=
for standin in "$here"/*/go.mod; do
  [ -f "$standin" ] || continue
  module=$(awk '$1 == "module" {print $2; exit}' "$standin")
  at=$(required "$module")
  [ -n "$at" ] && [ -z "$(download "$module@$at")" ] || continue
  dir=$(basename "$(dirname "$standin")")
  replaces="$replaces	$module => ./kubernetes/$dir
"
  standins="$standins $module@$at (kubernetes/$dir)"
done
{
  cat <<HEAD
// Kubernetes $version for the e2e (E2E_KUBERNETES=1.$minor): written by
// tests/e2e/kubernetes/pin.sh $version. etcd, Ginkgo and Gomega are the versions it requires.
HEAD
  [ -z "$notes" ] || echo "// Not served at $staging, so at another patch of 1.$minor:$notes."
  [ -z "$standins" ] || echo "// Its source not served, so built from a stand-in in tests/e2e:$standins."
  [ -z "$skipped" ] || echo "// Served at no v0.$minor version, and not imported by what the e2e builds:$skipped."
  cat <<HEAD
module github.com/flexd/flexd/tests/e2e

go $godir

tool github.com/onsi/ginkgo/v2/ginkgo

require (
	github.com/onsi/ginkgo/v2 $(required github.com/onsi/ginkgo/v2)
	github.com/onsi/gomega $(required github.com/onsi/gomega)
	go.etcd.io/etcd/server/v3 $(required go.etcd.io/etcd/client/v3)
	k8s.io/kubernetes $version
)

// Its staging modules at the release's v0 versions, as projects that import Kubernetes pin them.
replace (
${replaces})
HEAD
} > "$out"
rm -f "${out%.mod}.sum"
# Not `go mod tidy`: it would resolve every package of the module, the scenarios too (built
# against the newest client-go, whatever the cluster), and raise Kubernetes to the newest.
# Listing only what is built from this file adds just their requirements and sums.
tags=$(E2E_KUBERNETES=1.$minor "$here/../tools.sh" build-tags)
(cd "$here/.." && GOFLAGS=-mod=mod go list -modfile="$out" -tags "$tags" -deps -test ./cmd/kube ./cmd/storage-e2e github.com/onsi/ginkgo/v2/ginkgo >/dev/null)
grep -q "^	k8s.io/kubernetes $version\$" "$out" || { echo "pin.sh: resolving raised k8s.io/kubernetes above $version" >&2; exit 1; }
echo "$out"
