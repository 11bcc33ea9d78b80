#!/usr/bin/env bash
# Install Debian's Chromium, which the html report's test opens headless
# (tests/unit/test_simreport_html.py). Safe to run again: does nothing when it is there.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "install-chromium.sh: must run as root (apt-get needs it)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they cannot serve the package, and once more if
# they are there but stale (the install then fails to fetch).
if ! apt-cache show chromium >/dev/null 2>&1; then
  apt-get update
fi
if ! apt-get install -y --no-install-recommends chromium; then
  apt-get update
  apt-get install -y --no-install-recommends chromium
fi
