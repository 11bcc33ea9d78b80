#!/usr/bin/env bash
# Builds helm from the Go module proxy into the cache beside the local control plane
# (~/.cache/muster/helm-<version>/bin/helm), once; later runs find it and do nothing.
# Nothing is downloaded except Go modules (helm.sh/helm/v3 builds with a plain `go install`).
# Prints the binary's path on stdout (`make helm` links it into .venv/bin).
set -euo pipefail

HELM_VERSION="${MUSTER_HELM_VERSION:-v3.22.0}"
OUT="${1:-${MUSTER_CACHE_DIR:-$HOME/.cache/muster}/helm-${HELM_VERSION}/bin}"

command -v go >/dev/null 2>&1 || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null 2>&1 || { echo "[install-helm] Go (>= 1.26) is required" >&2; exit 1; }

if [ -x "$OUT/helm" ]; then
  echo "$OUT/helm"
  exit 0
fi
mkdir -p "$OUT"
echo "[install-helm] building helm $HELM_VERSION into $OUT" >&2
# helm's own Makefile stamps the Kubernetes version it was built against (from its client-go,
# v0.N -> 1.N); without it `helm template` assumes Kubernetes 1.20 and refuses the chart.
gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit(d.get("Error")))')"
k8s_minor="$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]; exit}' "$gomod")"
[ -n "$k8s_minor" ] || { echo "[install-helm] no k8s.io/client-go in $gomod" >&2; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags="$ldflags -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
done
# A private GOBIN so that a half-built binary never sits where the next run looks.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
mv "$tmp/helm" "$OUT/helm"
"$OUT/helm" version --short >&2
echo "$OUT/helm"
