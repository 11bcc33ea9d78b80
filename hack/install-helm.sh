#!/usr/bin/env bash
# Builds helm from the Go module proxy into the cache beside the local control plane
# (~/.cache/muster/helm-<version>/bin/helm), once; later runs find it and do nothing.
# Nothing is downloaded except Go modules (helm.sh/helm/v3 builds with a plain `go install`).
set -euo pipefail

HELM_VERSION="${MUSTER_HELM_VERSION:-v3.22.0}"
OUT="${1:-${MUSTER_CACHE_DIR:-$HOME/.cache/muster}/helm-${HELM_VERSION}/bin}"

command -v go >/dev/null 2>&1 || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null 2>&1 || { echo "[install-helm] Go (>= 1.26) is required" >&2; exit 1; }

if [ -x "$OUT/helm" ]; then
  exit 0
fi
mkdir -p "$OUT"
echo "[install-helm] building helm $HELM_VERSION into $OUT" >&2
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
# A private GOBIN so that a half-built binary never sits where the next run looks.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
mv "$tmp/helm" "$OUT/helm"
"$OUT/helm" version --short >&2
