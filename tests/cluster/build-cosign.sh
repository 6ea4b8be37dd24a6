#!/usr/bin/env bash
# Builds the cosign CLI from its Go module once, into $NODEWRIGHT_CACHE/cosign-<version>/cosign,
# and prints the path. The signature interop tests run it against the test registry.
set -euo pipefail
version=v2.6.5
cache="${NODEWRIGHT_CACHE:-/var/cache/nodewright}"
out="$cache/cosign-$version"
if [ -x "$out/cosign" ]; then
  echo "$out/cosign"
  exit 0
fi
# Asked only whether it is built (a test deciding to skip): it is not.
if [ -n "${NODEWRIGHT_CHECK_ONLY:-}" ]; then
  exit 3
fi
echo "building cosign $version from its Go module (once)" >&2
mkdir -p "$out"
(cd /tmp && GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$out" nice -n "${NODEWRIGHT_GO_NICE:-0}" go install "github.com/sigstore/cosign/v2/cmd/cosign@$version") >&2
echo "$out/cosign"
