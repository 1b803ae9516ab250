#!/usr/bin/env bash
# Makes sure the commands the lab's network namespaces need are present: unshare, nsenter
# and mount (util-linux) and ip (iproute2). Debian images ship them; on a machine without
# them they are installed from Debian's packages (as root).
set -euo pipefail
missing=()
for cmd in unshare nsenter mount; do command -v "$cmd" >/dev/null || missing+=(util-linux); done
command -v ip >/dev/null || missing+=(iproute2)
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "the lab needs: $pkgs (install them, then run make again)" >&2
  exit 1
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs
