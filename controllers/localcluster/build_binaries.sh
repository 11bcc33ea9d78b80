#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy into a versioned cache directory.
#
# k8s.io/kubernetes cannot be `go install`ed directly: its go.mod replaces every staging
# module with ./staging/..., so we build it from a throwaway wrapper module that pins each
# staging module to the matching published v0.x release. etcd has the same problem.
# Nothing is downloaded except Go modules.
set -euo pipefail

K8S_VERSION="${MUSTER_K8S_VERSION:-v1.37.1}"
ETCD_VERSION="${MUSTER_ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${MUSTER_KWOK_VERSION:-v0.8.0}"
OUT="${1:-${MUSTER_CACHE_DIR:-$HOME/.cache/muster}/k8s-${K8S_VERSION}/bin}"

# Go's default install location, for shells whose PATH was not set up by a login profile.
command -v go >/dev/null 2>&1 || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null 2>&1 || { echo "[build-control-plane] Go (>= 1.26) is required" >&2; exit 1; }

mkdir -p "$OUT"
log() { printf '[build-control-plane] %s\n' "$*" >&2; }

staging_version="v0.${K8S_VERSION#v1.}"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"

need_k8s=0
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
  [ -x "$OUT/$b" ] || need_k8s=1
done

if [ "$need_k8s" = 1 ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  log "building Kubernetes $K8S_VERSION (staging $staging_version) in $work"
  gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit(d.get("Error")))')"
  mapfile -t staging < <(grep -E '^\s*k8s.io/[A-Za-z0-9._-]+ => \./staging/' "$gomod" | awk '{print $1}')
  [ "${#staging[@]}" -gt 0 ] || { log "no staging modules found in $gomod"; exit 1; }
  {
    echo "module muster.dev/k8s-build"
    echo
    echo "go $(awk '/^go /{print $2; exit}' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	$m => $m $staging_version"; done
    echo ")"
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$work" && GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$K8S_VERSION" >&2)
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    [ -x "$OUT/$b" ] && continue
    log "go build $b"
    (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$OUT/$b.tmp" "$OUT/$b"
  done
fi

if [ ! -x "$OUT/etcd" ]; then
  work_etcd="$(mktemp -d)"
  log "building etcd $ETCD_VERSION in $work_etcd"
  (cd "$work_etcd" && printf 'module muster.dev/etcd-build\n\ngo 1.24\n' > go.mod \
    && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 \
    && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$OUT/etcd.tmp" "$OUT/etcd"
  rm -rf "$work_etcd"
fi

if [ ! -x "$OUT/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$OUT" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
fi

log "binaries ready in $OUT"
ls -1 "$OUT" >&2
