#!/usr/bin/env bash
# Builds the test control plane binary (ktest) once per source change and prints its path.
# The result is cached under $NODEWRIGHT_CACHE (default /var/cache/nodewright) keyed by a
# hash of the Go sources, go.mod/go.sum and the Go version, so CI and repeated test runs
# build it once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${NODEWRIGHT_CACHE:-/var/cache/nodewright}"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
key="$( (cd "$here" && cat go.mod go.sum ./*.go; go version) | sha256sum | cut -c1-16)"
out="$cache/ktest/$key/ktest"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
# Asked only whether it is built (a test deciding to skip): it is not.
if [ -n "${NODEWRIGHT_CHECK_ONLY:-}" ]; then
  exit 3
fi
mkdir -p "$(dirname "$out")"
echo "building the test control plane (Kubernetes v1.36.3: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet); the first build takes several minutes" >&2
start=$(date +%s)
ldflags="-s -w"
for kv in gitVersion=v1.36.3 gitMajor=1 gitMinor=36 gitTreeState=clean; do
  ldflags="$ldflags -X k8s.io/component-base/version.$kv"
done
# Modules first at the caller's priority, then the compile at NODEWRIGHT_GO_NICE (cargo
# xtask compiles beside cargo at 19).
(cd "$here" && go mod download)
(cd "$here" && nice -n "${NODEWRIGHT_GO_NICE:-0}" go build -trimpath -buildvcs=false -tags providerless -ldflags "$ldflags" -o "$out.tmp" .)
mv "$out.tmp" "$out"
echo "built $out in $(( $(date +%s) - start ))s ($(du -h "$out" | cut -f1))" >&2
echo "$out"
