#!/usr/bin/env bash
# Copies the manifests of a third-party server the lab runs in its guest cluster, at its
# pinned version, from its Go module zip into DEST, next to its binary:
#   cert-manager   DEST/crds/*.yaml: cert-manager's CRDs (deploy/crds), with the Helm
#                  placeholders of their labels filled in as `helm install cert-manager` does
#   metrics-server DEST/components.yaml: the release manifests, rendered with kustomize from
#                  manifests/overlays/release (what the release's components.yaml is)
# Usage: fetch-thirdparty-manifests.sh cert-manager DEST VERSION
#        fetch-thirdparty-manifests.sh metrics-server DEST VERSION KUSTOMIZE
set -euo pipefail
what=$1 dest=$2 version=$3

moddir() { # module@version -> extracted module directory in the module cache
  (cd "$(mktemp -d)" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

case $what in
cert-manager)
  src=$(moddir "github.com/cert-manager/cert-manager@$version")
  rm -rf "$dest/crds" && mkdir -p "$dest/crds"
  for f in "$src"/deploy/crds/crd-*.yaml; do
    sed -e "s/'{{ template \"cert-manager.name\" \. }}'/cert-manager/" \
        -e "s/'{{ \.Release\.Name }}'/cert-manager/" \
        -e '/^ *# Generated labels {{/d' "$f" > "$dest/crds/$(basename "$f")"
  done
  if grep -l '{{' "$dest"/crds/*.yaml; then echo "unexpected Helm template left in cert-manager CRDs" >&2; exit 1; fi
  touch "$dest/crds/.complete"
  ;;
metrics-server)
  kustomize=$4
  src=$(moddir "sigs.k8s.io/metrics-server@$version")
  mkdir -p "$dest"
  "$kustomize" build "$src/manifests/overlays/release" > "$dest/components.yaml.tmp"
  mv "$dest/components.yaml.tmp" "$dest/components.yaml"
  ;;
*) echo "unknown third party: $what" >&2; exit 2 ;;
esac
