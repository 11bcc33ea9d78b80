#!/usr/bin/env bash
# Builds one peer controller (JobSet, Kubeflow Trainer, Kueue...) from an exact version on the
# Go module proxy into OUT/bin, and copies the module's own manifests (CRDs, RBAC, webhooks,
# runtimes) into OUT/manifests, so the CRDs always match the binary.
#
# Usage: build_peer.sh MODULE VERSION PACKAGE BINARY OUT MANIFEST_DIR [NOSUMDB_MODULES]
#
# `go install MODULE/cmd@VERSION` does not work for these modules: it asks the proxy for the
# module's version list, which is refused here (only exact versions are served), and some
# carry replace directives. A throwaway wrapper module that requires the exact version and
# builds the main package from it works for all of them.
set -euo pipefail

MODULE="$1"; VERSION="$2"; PACKAGE="$3"; BINARY="$4"; OUT="$5"; MANIFESTS="$6"
NOSUMDB="${7:-}"

command -v go >/dev/null 2>&1 || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null 2>&1 || { echo "[build-peer] Go is required" >&2; exit 1; }
log() { printf '[build-peer %s@%s] %s\n' "$MODULE" "$VERSION" "$*" >&2; }

# Dependencies the checksum database does not know (it answers 404) are exempted by name
# only, never wholesale; the table in peers.py says which peer needs which.
if [ -n "$NOSUMDB" ]; then
  export GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}$NOSUMDB"
  log "checksum database skipped for: $NOSUMDB"
fi

mkdir -p "$OUT/bin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ ! -x "$OUT/bin/$BINARY" ]; then
  log "building $PACKAGE in $work"
  (cd "$work" && printf 'module muster.dev/peer-build\n\ngo 1.25\n' > go.mod \
    && GOFLAGS=-mod=mod go get "$PACKAGE@$VERSION" >&2 \
    && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath -ldflags "-s -w" \
         -o "$OUT/bin/$BINARY.tmp" "$PACKAGE")
  mv "$OUT/bin/$BINARY.tmp" "$OUT/bin/$BINARY"
fi

if [ ! -d "$OUT/manifests" ]; then
  dir="$(cd "$work" && go mod download -json "$MODULE@$VERSION" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')"
  [ -d "$dir/$MANIFESTS" ] || { log "no $MANIFESTS in $dir"; exit 1; }
  rm -rf "$OUT/manifests.tmp"
  cp -r "$dir/$MANIFESTS" "$OUT/manifests.tmp"
  chmod -R u+w "$OUT/manifests.tmp"  # the module cache is read-only
  mv "$OUT/manifests.tmp" "$OUT/manifests"
fi

log "ready in $OUT"
