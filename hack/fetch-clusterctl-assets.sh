#!/usr/bin/env bash
# Copies what the clusterctl tests need from a Cluster API release, at the pinned version, from
# its Go module zip into DEST, next to the clusterctl binary built from the same release:
#   DEST/metadata.yaml             the release's clusterctl metadata (release series -> contract)
#   DEST/core/*.yaml               the CRDs of the core provider (cluster-api)
#   DEST/bootstrap-kubeadm/*.yaml  the CRDs of the kubeadm bootstrap provider
#   DEST/control-plane-kubeadm/*.yaml  the CRDs of the kubeadm control-plane provider
# `clusterctl init` installs those three providers on a cluster that has none; the tests build
# local (file://) repositories for them from these files (e2e/clusterctl_test.go).
# Usage: fetch-clusterctl-assets.sh DEST CAPI_VERSION
set -euo pipefail
dest=$1 capi=$2

moddir() { # module@version -> extracted module directory in the module cache
  (cd "$(mktemp -d)" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

src=$(moddir "sigs.k8s.io/cluster-api@$capi")
rm -rf "$dest" && mkdir -p "$dest"/{core,bootstrap-kubeadm,control-plane-kubeadm}
cp "$src"/metadata.yaml "$dest/"
cp "$src"/core/config/crd/bases/*.yaml "$dest/core/"
cp "$src"/bootstrap/kubeadm/config/crd/bases/*.yaml "$dest/bootstrap-kubeadm/"
cp "$src"/controlplane/kubeadm/config/crd/bases/*.yaml "$dest/control-plane-kubeadm/"
chmod -R u+w "$dest"
touch "$dest/.complete"
