#!/usr/bin/env bash
# Builds the crane CLI (go-containerregistry) from its Go module once, into
# $NODEWRIGHT_CACHE/crane-<version>/crane, and prints the path. The payload benchmark pulls
# with it beside `nodewright plugin pull`.
set -euo pipefail
version=v0.22.1
cache="${NODEWRIGHT_CACHE:-/var/cache/nodewright}"
out="$cache/crane-$version"
if [ -x "$out/crane" ]; then
  echo "$out/crane"
  exit 0
fi
# Asked only whether it is built (a test deciding to skip): it is not.
if [ -n "${NODEWRIGHT_CHECK_ONLY:-}" ]; then
  exit 3
fi
echo "building crane $version from its Go module (once)" >&2
mkdir -p "$out"
(cd /tmp && GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$out" nice -n "${NODEWRIGHT_GO_NICE:-0}" go install "github.com/google/go-containerregistry/cmd/crane@$version") >&2
echo "$out/crane"
