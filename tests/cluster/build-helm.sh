#!/usr/bin/env bash
# Builds helm from its Go module (no Debian package provides it) once, into
# $NODEWRIGHT_CACHE/helm-<version>/helm, and prints the path.
set -euo pipefail
version=v3.22.0
cache="${NODEWRIGHT_CACHE:-/var/cache/nodewright}"
out="$cache/helm-$version"
if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi
# Asked only whether it is built (a test deciding to skip): it is not.
if [ -n "${NODEWRIGHT_CHECK_ONLY:-}" ]; then
  exit 3
fi
echo "building helm $version from its Go module (once)" >&2
mkdir -p "$out"
(cd /tmp && GOTOOLCHAIN=local GOBIN="$out" nice -n "${NODEWRIGHT_GO_NICE:-0}" go install "helm.sh/helm/v3/cmd/helm@$version") >&2
echo "$out/helm"
