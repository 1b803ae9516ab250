#!/usr/bin/env bash
# Copies the real CRDs of CAPI core, CAPK and Cilium, at pinned versions, from their Go
# module zips into DEST, so the lab installs exactly what those projects ship.
# Usage: fetch-crds.sh DEST CAPI_VERSION CAPK_VERSION CILIUM_VERSION
set -euo pipefail
dest=$1 capi=$2 capk=$3 cilium=$4

moddir() { # module@version -> extracted module directory in the module cache
  (cd "$(mktemp -d)" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

rm -rf "$dest" && mkdir -p "$dest"/{capi,capk,cilium}
capi_dir=$(moddir "sigs.k8s.io/cluster-api@$capi")
capk_dir=$(moddir "sigs.k8s.io/cluster-api-provider-kubevirt@$capk")
cilium_dir=$(moddir "github.com/cilium/cilium@$cilium")

cp "$capi_dir"/core/config/crd/bases/cluster.x-k8s.io_*.yaml "$dest/capi/"
cp "$capk_dir"/config/crd/bases/infrastructure.cluster.x-k8s.io_*.yaml "$dest/capk/"
crds=$cilium_dir/pkg/k8s/apis/cilium.io/client/crds
cp "$crds"/v2/ciliumloadbalancerippools.yaml "$crds"/v2alpha1/ciliuml2announcementpolicies.yaml "$dest/cilium/"
chmod -R u+w "$dest"
touch "$dest/.complete"
