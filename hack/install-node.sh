#!/usr/bin/env bash
# Debian packages the local cluster's real node needs (`muster local-cluster up --real-node`):
# containerd and runc to run containers, the CNI plugins for the pod network, iptables and
# conntrack for kube-proxy; buildah, mmdebstrap and umoci to build its images without a Docker
# engine (controllers/localcluster/images.py). Nothing is started or enabled here: the local
# cluster starts containerd with its own configuration and socket, and stops it at `down`.
#
# Safe to run again: it installs only what is missing. Runs as root (apt-get).
set -euo pipefail

PACKAGES=(runc containerd containernetworking-plugins iptables conntrack
          buildah skopeo umoci mmdebstrap busybox-static gcc libc6-dev)

if [[ "$(id -u)" -ne 0 ]]; then
  echo "install-node.sh: must run as root (apt-get needs it)" >&2
  exit 1
fi

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
if [[ "${#missing[@]}" -eq 0 ]]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# A machine without package lists cannot install anything: refresh them when needed, and
# once more if the lists are there but stale (the install then fails to fetch).
if ! apt-cache show containerd >/dev/null 2>&1; then
  apt-get update
fi
if ! apt-get install -y --no-install-recommends "${missing[@]}"; then
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
# The package may start containerd on a machine with an init system; the local cluster runs
# its own, on its own socket, so a system one is harmless but not needed.
