#!/usr/bin/env bash
# Makes sure the commands the lab needs are present: unshare, nsenter and mount (util-linux)
# and ip and bridge (iproute2) for its network namespaces, nft (nftables) for KubeVirt's
# masquerade rules on the kernel datapath (e2e/lab/kerneldatapath.go), and podman with runc,
# which run the manager image in e2e/image_test.go (docs/install.md). Debian images ship
# util-linux and iproute2; on a machine without them, and for nftables, podman and runc, they
# are installed from Debian's packages (as root). runc, not crun: crun refuses these
# machines' hybrid cgroups.
set -euo pipefail
missing=()
for cmd in unshare nsenter mount; do command -v "$cmd" >/dev/null || missing+=(util-linux); done
for cmd in ip bridge; do command -v "$cmd" >/dev/null || missing+=(iproute2); done
command -v nft >/dev/null || missing+=(nftables)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "the lab needs: $pkgs (install them, then run make again)" >&2
  exit 1
fi
echo "==> installing $pkgs (apt-get)" >&2
SECONDS=0
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs
printf '==> installed %s in %dm%02ds\n' "$pkgs" $((SECONDS / 60)) $((SECONDS % 60)) >&2
