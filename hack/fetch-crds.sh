#!/usr/bin/env bash
# Copies the real CRDs of CAPI core, CAPK, Cilium and MetalLB, at pinned versions, from their Go
# module zips into DEST, so the lab installs exactly what those projects ship: every CRD of
# CAPI core (cluster, addons, ipam and runtime groups) and, in DEST/capi-webhooks, the core
# manager's admission webhook configurations (lab.StartCAPI registers them with url clientConfigs).
# Usage: fetch-crds.sh DEST CAPI_VERSION CAPK_VERSION CILIUM_VERSION METALLB_VERSION
set -euo pipefail
dest=$1 capi=$2 capk=$3 cilium=$4 metallb=$5

moddir() { # module@version -> extracted module directory in the module cache
  (cd "$(mktemp -d)" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

rm -rf "$dest" && mkdir -p "$dest"/{capi,capi-webhooks,capk,cilium,metallb}
capi_dir=$(moddir "sigs.k8s.io/cluster-api@$capi")
capk_dir=$(moddir "sigs.k8s.io/cluster-api-provider-kubevirt@$capk")
cilium_dir=$(moddir "github.com/cilium/cilium@$cilium")
metallb_dir=$(moddir "go.universe.tf/metallb@$metallb")

cp "$capi_dir"/core/config/crd/bases/*.yaml "$dest/capi/"
cp "$capi_dir"/core/config/webhook/manifests.yaml "$dest/capi-webhooks/"
cp "$capk_dir"/config/crd/bases/infrastructure.cluster.x-k8s.io_*.yaml "$dest/capk/"
# CAPK's release labels its CRDs with the contract versions they implement (commonLabels of
# its config/crd kustomization): CAPI finds the served version of a referenced kind by them.
labels=$(sed -n '/^commonLabels:/,/^$/{/^  /p}' "$capk_dir"/config/crd/kustomization.yaml)
[ -n "$labels" ] || { echo "no commonLabels in CAPK's config/crd/kustomization.yaml" >&2; exit 1; }
for f in "$dest"/capk/*.yaml; do
  grep -q '^  labels:' "$f" && { echo "$f already has labels" >&2; exit 1; }
  awk -v labels="$labels" '{ print } /^metadata:$/ && !done { print "  labels:"; n = split(labels, l, "\n"); for (i = 1; i <= n; i++) print "  " l[i]; done = 1 }' "$f" > "$f.tmp"
  mv "$f.tmp" "$f"
done
crds=$cilium_dir/pkg/k8s/apis/cilium.io/client/crds
cp "$crds"/v2/ciliumloadbalancerippools.yaml "$crds"/v2alpha1/ciliuml2announcementpolicies.yaml "$dest/cilium/"
# The BGP control plane's v2 API: the platform's cluster and peer configs, the advertisements
# (guestnet creates one per GuestIngress), and the per-node configs Cilium's operator derives
# from the cluster configs. v1.20 serves v2 (stored) and still v2alpha1.
cp "$crds"/v2/ciliumbgp{clusterconfigs,peerconfigs,advertisements,nodeconfigs,nodeconfigoverrides}.yaml "$dest/cilium/"
# Every CRD of MetalLB's config/crd/bases, as generated (its kustomization's only patch adds
# BGPPeer's v1beta1<->v1beta2 conversion webhook, which needs the controller's webhook server:
# without it the lab writes BGPPeers as v1beta2, the storage version).
cp "$metallb_dir"/config/crd/bases/metallb.io_*.yaml "$dest/metallb/"
chmod -R u+w "$dest"
touch "$dest/.complete"
