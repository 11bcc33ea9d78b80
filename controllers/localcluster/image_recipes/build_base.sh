#!/usr/bin/env bash
# The root filesystem of the local stand-in for `python:<version>-slim`: Debian's own Python
# with pip and venv, nothing else. images.py packages it with base.Dockerfile; no registry is
# reachable here, so no base image can be pulled.
#
# usage: build_base.sh OUT.tar SUITE [HOST-FILE...]
# Packages come from Debian's default mirror through apt, like any package install.
# mmdebstrap's merged-/usr setup installs usrmerge, which takes 48 MB of Perl along: nothing
# here uses it once /usr is merged, so it goes (perl-base, which dpkg needs, stays).
set -euo pipefail

out="$1"
suite="$2"
shift 2
log() { printf '[build-base] %s\n' "$*" >&2; }
command -v mmdebstrap >/dev/null || { log "mmdebstrap is required (apt-get install mmdebstrap)"; exit 1; }

# The files carried in from the host (images.py names them: its CA bundle, /etc/pip.conf and
# the `cert` file that names) keep their paths, so pip inside an image build trusts what the
# host trusts: where outbound TLS is re-signed by a local authority, Debian's CA bundle alone
# fails every pip download.
hooks=()
for path in "$@"; do
  hooks+=(--customize-hook="mkdir -p \"\$1$(dirname "$path")\" && cp -L '$path' \"\$1$path\"")
done

log "mmdebstrap $suite -> $out"
mmdebstrap \
  --variant=minbase \
  --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,usr-is-merged \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook='chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl $(chroot "$1" dpkg-query -W -f "\${Package} " "libperl5*" "perl-modules-5*")' \
  --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
  "${hooks[@]}" \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/cache/debconf/*-old "$1"/var/log/apt/* "$1"/var/log/dpkg.log "$1"/var/log/alternatives.log' \
  "$suite" "$out"
