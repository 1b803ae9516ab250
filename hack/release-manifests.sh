#!/usr/bin/env bash
# Writes the files of a guestnet release that clusterctl reads, into DIR:
#   addon-components.yaml  `kustomize build config/default`: what `clusterctl init --addon
#                          guestnet` installs, with ${VAR:=default} clusterctl variables
#   metadata.yaml          the release series -> Cluster API contract map (copied as it is)
#   cluster-template*.yaml, clusterclass-*.yaml  the templates/ for `clusterctl generate
#                          cluster --from <release URL>/<file>`
#   guestingresspolicy.yaml  the host admin's GuestIngressPolicy for a tenant namespace
#                          (`clusterctl generate yaml --from <release URL>/guestingresspolicy.yaml`)
#   admission-policies.yaml  `kustomize build config/admission`: the optional
#                          ValidatingAdmissionPolicies that keep tenants away from what guestnet
#                          trusts (docs/install.md#admission-policies); not in the components file,
#                          clusterctl does not install it
# The manager image is IMAGE:TAG, set with `kustomize edit set image` on a copy of config/ (the
# repository keeps the dev tag). The script fails unless metadata.yaml has a release series for
# TAG's major.minor, as clusterctl requires. `make release` adds the image archive and
# SHA256SUMS to these files.
# Usage: release-manifests.sh KUSTOMIZE DIR TAG IMAGE
set -euo pipefail
kustomize=$1 dir=$2 tag=$3 image=$4
cd "$(dirname "$0")/.."

[[ $tag =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)(-.+)?$ ]] || { echo "RELEASE_TAG=$tag is not vMAJOR.MINOR.PATCH" >&2; exit 1; }
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
if ! awk -v M="$major" -v m="$minor" '
    /^- major:|^  - major:/ { split($0, a, ":"); cur = a[2] + 0; next }
    /minor:/ { split($0, a, ":"); if (cur == M && a[2] + 0 == m) found = 1 }
    END { exit !found }' metadata.yaml; then
  echo "metadata.yaml has no release series $major.$minor for RELEASE_TAG=$tag" >&2; exit 1
fi

tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
cp -R config "$tmp/"
(cd "$tmp/config/manager" && "$kustomize" edit set image "controller=$image:$tag")
mkdir -p "$dir"
"$kustomize" build "$tmp/config/default" > "$dir/addon-components.yaml.tmp"
mv "$dir/addon-components.yaml.tmp" "$dir/addon-components.yaml"
"$kustomize" build config/admission > "$dir/admission-policies.yaml.tmp"
mv "$dir/admission-policies.yaml.tmp" "$dir/admission-policies.yaml"
cp metadata.yaml "$dir/metadata.yaml"
shopt -s nullglob
templates=(templates/*.yaml) # every file of templates/ is a release file (the Makefile's RELEASE_FILES)
if ((${#templates[@]})); then cp "${templates[@]}" "$dir/"; fi
echo "release $tag written to $dir: $(cd "$dir" && ls | tr '\n' ' ')"
