# guestnet: Cluster API add-on provider for nested KubeVirt clusters.
#
# Everything the build and the tests need beyond Go, git, make and gcc is built here from
# pinned versions and cached outside the repository (CACHE_DIR), so a second run is fast.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

# --- Pinned versions --------------------------------------------------------------------
K8S_VERSION            ?= v1.37.2
ETCD_VERSION           ?= v3.6.16
CAPI_VERSION           ?= v1.14.2
CAPK_VERSION           ?= v0.11.2
CILIUM_VERSION         ?= v1.20.2
CONTROLLER_GEN_VERSION ?= v0.23.0
KUSTOMIZE_VERSION      ?= v5.8.2
GOLANGCI_LINT_VERSION  ?= v2.15.0
# clusterctl is built from the same Cluster API release as the CRDs (hack/tools/clusterctl,
# whose go.mod pins it and pins the dependencies the provider shares to the provider's own
# versions, so that their compiled packages come from the same build cache).
CLUSTERCTL_VERSION     ?= $(CAPI_VERSION)
# Real third-party servers the lab runs in its guest cluster. Each is built in its own tools
# module (hack/tools/<name>, whose go.mod pins the same version), so that their old
# dependencies never touch the provider's.
CERT_MANAGER_VERSION   ?= v1.11.5
METRICS_SERVER_VERSION ?= v0.8.0
# Cilium's LB-IPAM runs for real in the host cluster: the operator's lbipam cell alone, from
# the same release as the Cilium CRDs (hack/tools/lbipam, whose go.mod pins it).
CILIUM_LBIPAM_VERSION  ?= $(CILIUM_VERSION)
# konnectivity (apiserver-network-proxy) server and agent, for the lab's guest flavour with an
# egress selector: the release whose konnectivity-client kube-apiserver $(K8S_VERSION) uses
# (hack/tools/konnectivity, whose go.mod pins it).
KONNECTIVITY_VERSION   ?= v0.36.0
# CAPK's manager runs for real in the host cluster (lab.StartCAPK), the release of the lab's
# CAPK CRDs, built in its own tools module (hack/tools/capk, whose go.mod pins it and keeps
# CAPK's own pins: CAPI v1.11, controller-runtime v0.22, k8s v0.34; it cannot build against
# the provider's CAPI v1.14).
CAPK_MANAGER_VERSION   ?= $(CAPK_VERSION)
# MetalLB's controller and speaker run for real in the host cluster (lab.StartMetalLB), with
# its native BGP implementation; built in their own tools module (hack/tools/metallb, whose
# go.mod pins it). The lab installs the CRDs of the same release. v0.16.2 requires an
# frr-k8s release the module proxy refuses.
METALLB_VERSION        ?= v0.16.1
# The lab's BGP (lab-bgp: an upstream router and the speakers of the played Cilium BGP
# control plane), built on GoBGP as a library (hack/tools/labbgp, whose go.mod pins it).
GOBGP_VERSION          ?= v3.37.0

# --- Cache layout (outside the repository) ----------------------------------------------
CACHE_DIR    ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/guestnet
K8S_BIN      := $(CACHE_DIR)/k8s-$(K8S_VERSION)
ETCD_BIN     := $(CACHE_DIR)/etcd-$(ETCD_VERSION)
TOOLS_BIN    := $(CACHE_DIR)/tools
CRD_DIR      := $(CACHE_DIR)/crds/capi-$(CAPI_VERSION)_capk-$(CAPK_VERSION)_cilium-$(CILIUM_VERSION)_metallb-$(METALLB_VERSION)
CERT_MANAGER_BIN   := $(CACHE_DIR)/cert-manager-$(CERT_MANAGER_VERSION)
METRICS_SERVER_BIN := $(CACHE_DIR)/metrics-server-$(METRICS_SERVER_VERSION)
CLUSTERCTL_BIN     := $(CACHE_DIR)/clusterctl-$(CLUSTERCTL_VERSION)
CLUSTERCTL         := $(CLUSTERCTL_BIN)/clusterctl
# The real Cluster API core manager the lab runs (lab.StartCAPI), same release as clusterctl.
CAPI_MANAGER       := $(CLUSTERCTL_BIN)/capi-manager
CILIUM_BIN         := $(CACHE_DIR)/cilium-$(CILIUM_LBIPAM_VERSION)
CILIUM_LBIPAM      := $(CILIUM_BIN)/cilium-lbipam
KONNECTIVITY_BIN   := $(CACHE_DIR)/konnectivity-$(KONNECTIVITY_VERSION)
KONNECTIVITY       := $(KONNECTIVITY_BIN)/konnectivity-server $(KONNECTIVITY_BIN)/konnectivity-agent
CAPK_BIN           := $(CACHE_DIR)/capk-$(CAPK_MANAGER_VERSION)
CAPK_MANAGER       := $(CAPK_BIN)/capk-manager
# The manager, and next to it its admission webhook configurations (config/webhook of the
# same release: lab.StartCAPK registers them with url clientConfigs).
CAPK_ASSETS        := $(CAPK_MANAGER) $(CAPK_BIN)/capk-webhooks.yaml
METALLB_BIN        := $(CACHE_DIR)/metallb-$(METALLB_VERSION)
METALLB            := $(METALLB_BIN)/metallb-controller $(METALLB_BIN)/metallb-speaker
LAB_BGP_BIN        := $(CACHE_DIR)/labbgp-gobgp-$(GOBGP_VERSION)
LAB_BGP            := $(LAB_BGP_BIN)/lab-bgp
CONTROLLER_GEN := $(TOOLS_BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
KUSTOMIZE      := $(TOOLS_BIN)/kustomize-$(KUSTOMIZE_VERSION)/kustomize
GOLANGCI_LINT  := $(TOOLS_BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)/golangci-lint

# The lab's tools modules are rebuilt when their inputs change, not when a fresh clone makes
# those files newer than the cached build (make compares times, and every file of a clone is
# new). A target depends on a stamp "<key>-<hash of its inputs>" (keys without '-'); building
# it removes the stamps of other inputs of the same key (prune_stamps STAMP; two targets of one
# key may prune at the same time), so that going back to them rebuilds.
STAMP_DIR := $(CACHE_DIR)/stamps
inputs_stamp = $(STAMP_DIR)/$(1)-$(shell cat $(2) | sha256sum | cut -c1-16)
prune_stamps = find $(STAMP_DIR) -name '$(firstword $(subst -, ,$(notdir $(1))))-*' ! -name '$(notdir $(1))' -exec rm -f {} +
CRDS_STAMP         := $(call inputs_stamp,crds,hack/fetch-crds.sh)
CLUSTERCTL_STAMP   := $(call inputs_stamp,clusterctl,hack/tools/clusterctl/go.mod hack/tools/clusterctl/go.sum)
LBIPAM_STAMP       := $(call inputs_stamp,lbipam,hack/tools/lbipam/main.go hack/tools/lbipam/go.mod hack/tools/lbipam/go.sum)
LAB_BGP_STAMP      := $(call inputs_stamp,labbgp,$(sort $(wildcard hack/tools/labbgp/*.go)) hack/tools/labbgp/go.mod hack/tools/labbgp/go.sum)
KONNECTIVITY_STAMP := $(call inputs_stamp,konnectivity,hack/tools/konnectivity/go.mod hack/tools/konnectivity/go.sum)
CAPK_STAMP         := $(call inputs_stamp,capk,hack/tools/capk/go.mod hack/tools/capk/go.sum)
METALLB_STAMP      := $(call inputs_stamp,metallb,hack/tools/metallb/go.mod hack/tools/metallb/go.sum)

KUBE_APISERVER          := $(K8S_BIN)/kube-apiserver
KUBE_CONTROLLER_MANAGER := $(K8S_BIN)/kube-controller-manager
KUBECTL                 := $(K8S_BIN)/kubectl
# The guest's kube-proxy, run per worker VM on the kernel datapath (lab.StartGuestKubeProxy).
KUBE_PROXY              := $(K8S_BIN)/kube-proxy
ETCD                    := $(ETCD_BIN)/etcd
K8S_BINARIES := $(KUBE_APISERVER) $(KUBE_CONTROLLER_MANAGER) $(KUBECTL) $(KUBE_PROXY)
LAB_BINARIES := $(K8S_BINARIES) $(ETCD)

CERT_MANAGER_WEBHOOK    := $(CERT_MANAGER_BIN)/cert-manager-webhook
CERT_MANAGER_CAINJECTOR := $(CERT_MANAGER_BIN)/cert-manager-cainjector
METRICS_SERVER          := $(METRICS_SERVER_BIN)/metrics-server
# Binaries, then manifests of the same releases (next to the binaries).
THIRD_PARTY_ASSETS := $(CERT_MANAGER_WEBHOOK) $(CERT_MANAGER_CAINJECTOR) $(METRICS_SERVER) \
	$(CERT_MANAGER_BIN)/crds/.complete $(METRICS_SERVER_BIN)/components.yaml
# clusterctl, and next to it what the tests' local repositories of the Cluster API providers
# need from the same release (CRDs and metadata.yaml, hack/fetch-clusterctl-assets.sh).
CLUSTERCTL_ASSETS := $(CLUSTERCTL) $(CLUSTERCTL_BIN)/capi/.complete $(CAPI_MANAGER)

K8S_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION))) \
	-X k8s.io/component-base/version.gitTreeState=clean
CERT_MANAGER_LDFLAGS   := -s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$(CERT_MANAGER_VERSION)
METRICS_SERVER_LDFLAGS := -s -w -X k8s.io/client-go/pkg/version.gitVersion=$(METRICS_SERVER_VERSION)
CLUSTERCTL_LDFLAGS     := -s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$(CLUSTERCTL_VERSION) \
	-X sigs.k8s.io/cluster-api/version.gitMajor=$(patsubst v%,%,$(word 1,$(subst ., ,$(CLUSTERCTL_VERSION)))) \
	-X sigs.k8s.io/cluster-api/version.gitMinor=$(word 2,$(subst ., ,$(CLUSTERCTL_VERSION))) \
	-X sigs.k8s.io/cluster-api/version.gitTreeState=clean

# The release: `make release-manifests` writes what clusterctl reads from a release of this
# provider (addon-components.yaml, metadata.yaml, the templates) into RELEASE_DIR, with the
# manager image IMAGE_NAME:RELEASE_TAG.
RELEASE_TAG ?= v0.1.0
RELEASE_DIR ?= out
IMAGE_NAME  ?= ghcr.io/guestnet/cluster-api-addon-provider-guestnet

# The manager image (`make image`, docs/install.md): built from Go with go-containerregistry
# (hack/tools/image, its own module) for every IMAGE_PLATFORMS, into an OCI image layout
# (IMAGE_LAYOUT, its index named RELEASE_TAG) and a tar archive of it (IMAGE_ARCHIVE, a
# release file). Same binaries and same SOURCE_DATE_EPOCH: same digests.
IMAGE_PLATFORMS   ?= linux/amd64 linux/arm64
# `make test` builds and checks the image of this machine's platform only: each platform is
# one more cold build of the manager (about 7 minutes on 2 cores). `make release` and
# `make image` build every IMAGE_PLATFORMS; TEST_IMAGE_PLATFORMS="linux/amd64 linux/arm64"
# tests both.
TEST_IMAGE_PLATFORMS ?= linux/$(shell go env GOARCH)
IMAGE_LAYOUT      ?= $(RELEASE_DIR)/image
IMAGE_ARCHIVE     ?= $(RELEASE_DIR)/guestnet-image.oci.tar
IMAGE_SOURCE      ?= https://github.com/guestnet/cluster-api-addon-provider-guestnet
IMAGE_REVISION    ?= $(shell git rev-parse HEAD)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct)
# How the manager binary of an image is built, here and in the Dockerfile (docker-build
# passes them): static (no libc in the image), no local paths, no build id or VCS stamp that
# would differ between two builds of the same source.
MANAGER_GOFLAGS := -trimpath -buildvcs=false
MANAGER_LDFLAGS ?= -s -w -buildid=

# Every test binary runs in a private network namespace that has only lo (DEVELOPERS.md
# safety rule); hack/labns sets it up and then execs the binary.
LABNS     := $(CURDIR)/hack/labns
TEST_PKGS ?= ./...
TEST_ARGS ?=

# What the lab needs, handed to the tests and the demo.
export GUESTNET_LAB_BIN := $(K8S_BIN):$(ETCD_BIN):$(CERT_MANAGER_BIN):$(METRICS_SERVER_BIN):$(CLUSTERCTL_BIN):$(CILIUM_BIN):$(KONNECTIVITY_BIN):$(CAPK_BIN):$(METALLB_BIN):$(LAB_BGP_BIN)
export GUESTNET_LAB_CRDS := $(CRD_DIR)
export GUESTNET_KUSTOMIZE := $(KUSTOMIZE)
# The release the clusterctl tests install (written by `make release-manifests`).
export GUESTNET_RELEASE_DIR := $(abspath $(RELEASE_DIR))
export GUESTNET_RELEASE_TAG := $(RELEASE_TAG)
export GUESTNET_RELEASE_IMAGE := $(IMAGE_NAME):$(RELEASE_TAG)
# The image `make image` built (e2e/image_test.go runs it under podman).
export GUESTNET_IMAGE_LAYOUT := $(abspath $(IMAGE_LAYOUT))
export GUESTNET_IMAGE_ARCHIVE := $(abspath $(IMAGE_ARCHIVE))
export GUESTNET_IMAGE_PLATFORMS := $(IMAGE_PLATFORMS)

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: demo
demo: lab-assets ## Start the two-cluster lab and show the state of host and guest.
	@$(call build_step,manager,go build -o bin/manager .)
	GUESTNET_MANAGER_BIN=$(abspath bin/manager) go run -exec $(LABNS) ./e2e/demo $(DEMO_ARGS)

.PHONY: test
test: ## Run checks, unit, integration and end-to-end lab tests (TEST_ARGS='-run X' for a subset).
	@$(MAKE) $(LAB_BUILD_PARALLEL) lab-assets-each tools
	@$(MAKE) --no-print-directory verify test-image-tool
	@$(MAKE) --no-print-directory release IMAGE_PLATFORMS="$(TEST_IMAGE_PLATFORMS)"
	GUESTNET_IMAGE_PLATFORMS="$(TEST_IMAGE_PLATFORMS)" GUESTNET_MANAGER_BIN=$(abspath bin/manager-linux-$(shell go env GOARCH)) \
		go test -exec $(LABNS) -count=1 -timeout 40m $(TEST_ARGS) $(TEST_PKGS)

# `make bench` (docs/performance.md; not part of `make test`): for each fleet size of BENCH_N, a fresh lab
# and the real manager binary, built as a release builds it, as its own process (e2e/bench);
# results, pprof profiles and the plot in BENCH_OUT.
BENCH_N            ?= 100 1000
BENCH_BRIDGE_EVERY ?= 5
BENCH_OUT          ?= out/bench
# Guest clusters per guest shard apiserver (lab.StartGuestShards; ceil(N / size) shards: each
# guest connection then sees a guest of about 80 Services; 40 shards of 25 overload 2 cores), and how
# many guest clusters are created at a time.
BENCH_SHARD_SIZE         ?= 50
BENCH_CREATE_CONCURRENCY ?= 8
# TestBenchLargeGuest: one guest holding this many Services (docs/performance.md, "A large guest");
# BENCH_BASELINE_BIN, when set, is measured too (e.g. an older manager binary).
BENCH_GUEST_SERVICES ?= 20000
# BENCH_GOMEMLIMIT, when set (e.g. 1500MiB), is the manager's GOMEMLIMIT, as config/manager sets it
# to the container's memory limit: what a limit costs in CPU and time at a fleet's size.
BENCH_GOMEMLIMIT ?=

.PHONY: bench
bench: lab-assets ## Measure time to Ready, requests per object, RSS and CPU for fleets of BENCH_N guest clusters (out/bench/).
	@$(call build_step,manager (as a release builds it),CGO_ENABLED=0 go build $(MANAGER_GOFLAGS) -ldflags "$(MANAGER_LDFLAGS)" -o bin/manager .)
	GUESTNET_MANAGER_BIN=$(abspath bin/manager) BENCH_N="$(BENCH_N)" BENCH_BRIDGE_EVERY=$(BENCH_BRIDGE_EVERY) \
		BENCH_SHARD_SIZE=$(BENCH_SHARD_SIZE) BENCH_CREATE_CONCURRENCY=$(BENCH_CREATE_CONCURRENCY) \
		BENCH_GUEST_SERVICES=$(BENCH_GUEST_SERVICES) BENCH_BASELINE_BIN=$(BENCH_BASELINE_BIN) \
		BENCH_GOMEMLIMIT=$(BENCH_GOMEMLIMIT) \
		BENCH_OUT=$(abspath $(BENCH_OUT)) go test -exec $(LABNS) -count=1 -timeout 180m -run TestBench -v ./e2e/bench/

# Where `make generate` writes; verify-generate points these at a scratch directory.
GEN_OBJECT_DIR ?=
GEN_CRD_DIR    ?= config/crd/bases
GEN_RBAC_DIR   ?= config/rbac

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code, CRDs and RBAC.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/... $(if $(GEN_OBJECT_DIR),output:object:dir=$(GEN_OBJECT_DIR))
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=$(GEN_CRD_DIR)
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=./controllers/... paths=./exp/... output:rbac:artifacts:config=$(GEN_RBAC_DIR)

.PHONY: verify-generate
verify-generate: $(CONTROLLER_GEN) ## Fail when generated files differ from what `make generate` writes.
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(MAKE) --no-print-directory -s generate GEN_OBJECT_DIR=$$tmp/object GEN_CRD_DIR=$$tmp/crd GEN_RBAC_DIR=$$tmp/rbac && \
	diff -u api/v1alpha1/zz_generated.deepcopy.go $$tmp/object/zz_generated.deepcopy.go && \
	diff -ru config/crd/bases $$tmp/crd && \
	diff -u config/rbac/role.yaml $$tmp/rbac/role.yaml || \
	{ echo "generated files are stale: run 'make generate' and commit the result"; exit 1; }

.PHONY: verify
verify: verify-generate vet lint ## Generated files up to date, go vet and golangci-lint clean.

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (.golangci.yml) on the provider's module (not the hack/tools modules).
	$(GOLANGCI_LINT) run ./...

.PHONY: vet
vet: ## go vet every module of the repository.
	go vet ./...

.PHONY: manifests
manifests: $(KUSTOMIZE) ## Print the components file built from config/default.
	@$(KUSTOMIZE) build config/default

.PHONY: build
build: ## Build the manager binary into bin/.
	go build -o bin/manager .

##@ Release

.PHONY: release-manifests
release-manifests: $(KUSTOMIZE) ## Write the clusterctl release files (addon-components.yaml, metadata.yaml, admission-policies.yaml) into RELEASE_DIR (out/).
	@hack/release-manifests.sh $(KUSTOMIZE) $(RELEASE_DIR) $(RELEASE_TAG) $(IMAGE_NAME)

# The files of a GitHub release, all in RELEASE_DIR; SHA256SUMS lists them (the release
# workflow uploads what it lists).
RELEASE_FILES = addon-components.yaml metadata.yaml admission-policies.yaml \
	$(notdir $(wildcard templates/*.yaml)) \
	$(notdir $(IMAGE_ARCHIVE))

.PHONY: release
release: release-manifests image ## Write everything a release carries into RELEASE_DIR: components, metadata, templates, the image archive, SHA256SUMS.
	@[ "$(abspath $(dir $(IMAGE_ARCHIVE)))" = "$(abspath $(RELEASE_DIR))" ] || { echo "IMAGE_ARCHIVE must be in RELEASE_DIR"; exit 1; }
	@cd $(RELEASE_DIR) && sha256sum $(RELEASE_FILES) > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS
	@echo "release $(RELEASE_TAG) in $(RELEASE_DIR):" && sed 's/^/  /' $(RELEASE_DIR)/SHA256SUMS

##@ Image

# build_step WHAT,COMMAND says what it builds, runs COMMAND (in a subshell: a `cd` stays in
# it) and says how long it took; a failing COMMAND fails the step. (COMMAND must not contain
# a comma.)
build_step = start=$$(date +%s); echo "==> building $(1)" >&2; ( $(2) ) || exit $$?; \
	secs=$$(( $$(date +%s) - start )); printf '==> built %s in %dm%02ds\n' "$(1)" $$((secs / 60)) $$((secs % 60)) >&2

# go_build_into MODULE,GOFLAGS,DIR,NAME=PACKAGE...: one go build, in the tools module
# hack/tools/MODULE, of every PACKAGE (a main package) into DIR/NAME. One process for all the
# binaries of a module compiles the packages they share once (two processes at a time would
# each compile them) and links one binary while it compiles the next.
go_build_into = cd hack/tools/$(1) && rm -rf $(3)/.new && mkdir -p $(3)/.new && go build $(2) -o $(3)/.new/ $(foreach b,$(4),$(lastword $(subst =, ,$(b)))) && \
	$(foreach b,$(4),mv $(3)/.new/$(notdir $(lastword $(subst =, ,$(b)))) $(3)/$(firstword $(subst =, ,$(b))) &&) rmdir $(3)/.new

MANAGER_BINARIES := $(foreach p,$(IMAGE_PLATFORMS),bin/manager-$(subst /,-,$(p)))
IMAGE_TOOL := go -C hack/tools/image run .

.PHONY: image
image: $(MANAGER_BINARIES) ## Build the manager image without Docker (IMAGE_PLATFORMS) into IMAGE_LAYOUT (OCI layout) and IMAGE_ARCHIVE.
	@mkdir -p $(dir $(IMAGE_ARCHIVE))
	@$(call build_step,image $(IMAGE_NAME):$(RELEASE_TAG) ($(IMAGE_PLATFORMS)),$(IMAGE_TOOL) build \
		$(foreach p,$(IMAGE_PLATFORMS),--binary $(p)=$(abspath bin/manager-$(subst /,-,$(p)))) \
		--layout $(abspath $(IMAGE_LAYOUT)) --archive $(abspath $(IMAGE_ARCHIVE)) --tag $(RELEASE_TAG) \
		--source $(IMAGE_SOURCE) --version $(RELEASE_TAG) --revision $(IMAGE_REVISION) --created $(SOURCE_DATE_EPOCH))

# Always run: go build knows whether the binary is up to date (its build cache).
.PHONY: $(MANAGER_BINARIES)
$(MANAGER_BINARIES): bin/manager-%:
	@mkdir -p bin
	@$(call build_step,manager for $(subst -,/,$*),CGO_ENABLED=0 GOOS=$(word 1,$(subst -, ,$*)) GOARCH=$(word 2,$(subst -, ,$*)) \
		go build $(MANAGER_GOFLAGS) -ldflags "$(MANAGER_LDFLAGS)" -o $@.tmp . && mv $@.tmp $@)

.PHONY: image-push
image-push: image ## Push the image (every platform, one index) to IMAGE_NAME:RELEASE_TAG with the credentials of `docker login`.
	@$(IMAGE_TOOL) push --layout $(abspath $(IMAGE_LAYOUT)) --tag $(RELEASE_TAG) --to $(IMAGE_NAME):$(RELEASE_TAG)

.PHONY: test-image-tool
test-image-tool: ## Vet and test hack/tools/image (its own module).
	go -C hack/tools/image vet ./...
	go -C hack/tools/image test -exec $(LABNS) -count=1 ./...

# For people with Docker (none runs here): the same image from the Dockerfile, for ARCH.
ARCH       ?= $(shell go env GOARCH)
GO_VERSION ?= $(patsubst go%,%,$(shell go env GOVERSION))

.PHONY: docker-build
docker-build: ## Build the image with Docker for ARCH (IMAGE_NAME:RELEASE_TAG-ARCH); needs a Docker engine.
	DOCKER_BUILDKIT=1 docker build --platform linux/$(ARCH) \
		--build-arg GO_VERSION=$(GO_VERSION) --build-arg goproxy=$(shell go env GOPROXY) \
		--build-arg ldflags="$(MANAGER_LDFLAGS)" --build-arg SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) \
		--build-arg source=$(IMAGE_SOURCE) --build-arg version=$(RELEASE_TAG) --build-arg revision=$(IMAGE_REVISION) \
		-t $(IMAGE_NAME):$(RELEASE_TAG)-$(ARCH) .

##@ Lab assets (cached in CACHE_DIR)

# The lab's builds run LAB_BUILD_JOBS at a time (make -j). One at a time on 2 cores: each go
# build already compiles on both, and two at once were slower cold (docs/lab.md). Their output
# is not synced (make -O would hold a step's "==> building" line until the step ends): each
# step's lines are written whole, and make names the target of a step that fails.
LAB_BUILD_JOBS ?= 1
LAB_BUILD_PARALLEL = --no-print-directory -j$(LAB_BUILD_JOBS)

.PHONY: lab-assets
lab-assets: ## Build the lab's binaries (control planes, cert-manager, metrics-server, clusterctl, the CAPI core manager, Cilium LB-IPAM, konnectivity, CAPK, MetalLB, lab-bgp) and fetch third-party CRDs/manifests, LAB_BUILD_JOBS at a time.
	@$(MAKE) $(LAB_BUILD_PARALLEL) lab-assets-each

.PHONY: lab-assets-each
lab-assets-each: host-tools $(LAB_BINARIES) $(CRD_DIR)/.complete $(THIRD_PARTY_ASSETS) $(CLUSTERCTL_ASSETS) $(CILIUM_LBIPAM) $(KONNECTIVITY) $(CAPK_ASSETS) $(METALLB) $(LAB_BGP)

.PHONY: host-tools
host-tools: ## Make sure unshare/nsenter (util-linux), ip and bridge (iproute2), nft (nftables), podman and runc are installed.
	@hack/ensure-host-tools.sh

$(ETCD):
	@$(call build_step,etcd (hack/tools/etcd),cd hack/tools/etcd && go build -trimpath -ldflags "-s -w" -o $@.tmp . && mv $@.tmp $@)

$(K8S_BINARIES) &:
	@$(call build_step,$(notdir $(K8S_BINARIES)) (hack/tools/k8s),$(call go_build_into,k8s,-trimpath -ldflags "$(K8S_LDFLAGS)",$(K8S_BIN),$(foreach b,$(notdir $(K8S_BINARIES)),$(b)=k8s.io/kubernetes/cmd/$(b))))

# Fetched again when the script changes (what it copies).
$(CRD_DIR)/.complete: $(CRDS_STAMP)
	hack/fetch-crds.sh $(CRD_DIR) $(CAPI_VERSION) $(CAPK_VERSION) $(CILIUM_VERSION) $(METALLB_VERSION)
	@$(call prune_stamps,$<)

$(CERT_MANAGER_WEBHOOK) $(CERT_MANAGER_CAINJECTOR) &:
	@$(call build_step,cert-manager webhook and cainjector (hack/tools/cert-manager),$(call go_build_into,cert-manager,-trimpath -ldflags "$(CERT_MANAGER_LDFLAGS)",$(CERT_MANAGER_BIN),$(foreach b,webhook cainjector,cert-manager-$(b)=github.com/cert-manager/cert-manager/cmd/$(b))))

$(METRICS_SERVER):
	mkdir -p $(dir $@)
	@$(call build_step,metrics-server (hack/tools/metrics-server),cd hack/tools/metrics-server && go build -trimpath -ldflags "$(METRICS_SERVER_LDFLAGS)" -o $@.tmp sigs.k8s.io/metrics-server/cmd/metrics-server && mv $@.tmp $@)

$(CERT_MANAGER_BIN)/crds/.complete:
	hack/fetch-thirdparty-manifests.sh cert-manager $(CERT_MANAGER_BIN) $(CERT_MANAGER_VERSION)

$(METRICS_SERVER_BIN)/components.yaml: | $(KUSTOMIZE)
	hack/fetch-thirdparty-manifests.sh metrics-server $(METRICS_SERVER_BIN) $(METRICS_SERVER_VERSION) $(KUSTOMIZE)

# clusterctl and the Cluster API core manager (main package sigs.k8s.io/cluster-api/core;
# there is no root main.go). No -trimpath here, unlike the other tools: they share most of
# their dependencies (client-go, controller-runtime, Cluster API's util) with the provider at
# the same versions, and -trimpath would compile them again instead of reusing what
# `go vet`/`go test` compile.
$(CLUSTERCTL) $(CAPI_MANAGER) &: $(CLUSTERCTL_STAMP)
	@grep -qE '^(require)?[[:space:]]*sigs\.k8s\.io/cluster-api $(CLUSTERCTL_VERSION)$$' hack/tools/clusterctl/go.mod || \
		{ echo "hack/tools/clusterctl/go.mod does not pin sigs.k8s.io/cluster-api $(CLUSTERCTL_VERSION)"; exit 1; }
	@$(call build_step,clusterctl and the Cluster API core manager $(CLUSTERCTL_VERSION) (hack/tools/clusterctl),$(call go_build_into,clusterctl,-ldflags "$(CLUSTERCTL_LDFLAGS)",$(CLUSTERCTL_BIN),clusterctl=sigs.k8s.io/cluster-api/cmd/clusterctl capi-manager=sigs.k8s.io/cluster-api/core))
	@$(call prune_stamps,$<)

# The real Cilium LB-IPAM (hack/tools/lbipam/main.go runs the operator's lbipam cell alone);
# rebuilt when its main or pins change (go build reuses its cache).
$(CILIUM_LBIPAM): $(LBIPAM_STAMP)
	@grep -qE '^(require)?[[:space:]]*github\.com/cilium/cilium $(CILIUM_LBIPAM_VERSION)$$' hack/tools/lbipam/go.mod || \
		{ echo "hack/tools/lbipam/go.mod does not pin github.com/cilium/cilium $(CILIUM_LBIPAM_VERSION)"; exit 1; }
	@mkdir -p $(dir $@)
	@$(call build_step,Cilium LB-IPAM $(CILIUM_LBIPAM_VERSION) (hack/tools/lbipam),cd hack/tools/lbipam && \
		go build -trimpath -ldflags "-s -w" -o $@.tmp . && mv $@.tmp $@)
	@$(call prune_stamps,$<)

# The lab's BGP router and speaker on GoBGP (hack/tools/labbgp); rebuilt when its sources or
# pins change (go build reuses its cache).
$(LAB_BGP): $(LAB_BGP_STAMP)
	@grep -qE '^(require)?[[:space:]]*github\.com/osrg/gobgp/v3 $(GOBGP_VERSION)$$' hack/tools/labbgp/go.mod || \
		{ echo "hack/tools/labbgp/go.mod does not pin github.com/osrg/gobgp/v3 $(GOBGP_VERSION)"; exit 1; }
	@mkdir -p $(dir $@)
	@$(call build_step,lab-bgp on GoBGP $(GOBGP_VERSION) (hack/tools/labbgp),cd hack/tools/labbgp && \
		go build -trimpath -ldflags "-s -w" -o $@.tmp . && mv $@.tmp $@)
	@$(call prune_stamps,$<)

# konnectivity's server and agent (cmd/server, cmd/agent of sigs.k8s.io/apiserver-network-proxy);
# its go.mod requires konnectivity-client at the same version explicitly (the project's own
# replace of it is not seen from another module).
$(KONNECTIVITY) &: $(KONNECTIVITY_STAMP)
	@grep -qE '^(require)?[[:space:]]*sigs\.k8s\.io/apiserver-network-proxy $(KONNECTIVITY_VERSION)( |$$)' hack/tools/konnectivity/go.mod || \
		{ echo "hack/tools/konnectivity/go.mod does not pin sigs.k8s.io/apiserver-network-proxy $(KONNECTIVITY_VERSION)"; exit 1; }
	@$(call build_step,konnectivity server and agent $(KONNECTIVITY_VERSION) (hack/tools/konnectivity),$(call go_build_into,konnectivity,-trimpath -ldflags "-s -w",$(KONNECTIVITY_BIN),$(foreach b,server agent,konnectivity-$(b)=sigs.k8s.io/apiserver-network-proxy/cmd/$(b))))
	@$(call prune_stamps,$<)

# The real CAPK manager (the root main package of sigs.k8s.io/cluster-api-provider-kubevirt);
# hack/tools/capk has no Go files (a main package cannot be imported), only its go.mod pins.
$(CAPK_MANAGER): $(CAPK_STAMP)
	@grep -qE '^(require)?[[:space:]]*sigs\.k8s\.io/cluster-api-provider-kubevirt $(CAPK_MANAGER_VERSION)$$' hack/tools/capk/go.mod || \
		{ echo "hack/tools/capk/go.mod does not pin sigs.k8s.io/cluster-api-provider-kubevirt $(CAPK_MANAGER_VERSION)"; exit 1; }
	@mkdir -p $(dir $@)
	@$(call build_step,CAPK manager $(CAPK_MANAGER_VERSION) (hack/tools/capk),cd hack/tools/capk && \
		go build -trimpath -ldflags "-s -w" -o $@.tmp sigs.k8s.io/cluster-api-provider-kubevirt && mv $@.tmp $@)
	@$(call prune_stamps,$<)

$(CAPK_BIN)/capk-webhooks.yaml: $(CAPK_STAMP)
	@mkdir -p $(dir $@)
	dir=$$(go -C hack/tools/capk list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api-provider-kubevirt) && \
		cp "$$dir/config/webhook/manifests.yaml" $@.tmp && chmod u+w $@.tmp && mv $@.tmp $@
	@$(call prune_stamps,$<)

# MetalLB's controller and speaker (the main packages go.universe.tf/metallb/controller and
# go.universe.tf/metallb/speaker); hack/tools/metallb has no Go files, only its go.mod pins.
$(METALLB) &: $(METALLB_STAMP)
	@grep -qE '^(require)?[[:space:]]*go\.universe\.tf/metallb $(METALLB_VERSION)$$' hack/tools/metallb/go.mod || \
		{ echo "hack/tools/metallb/go.mod does not pin go.universe.tf/metallb $(METALLB_VERSION)"; exit 1; }
	@$(call build_step,MetalLB controller and speaker $(METALLB_VERSION) (hack/tools/metallb),$(call go_build_into,metallb,-trimpath -ldflags "-s -w",$(METALLB_BIN),$(foreach b,controller speaker,metallb-$(b)=go.universe.tf/metallb/$(b))))
	@$(call prune_stamps,$<)

# A stamp that does not exist yet is new: what depends on it is built. Named here, not by a
# pattern: make would skip a missing stamp that only a pattern rule makes (an intermediate).
$(CRDS_STAMP) $(CLUSTERCTL_STAMP) $(LBIPAM_STAMP) $(LAB_BGP_STAMP) $(KONNECTIVITY_STAMP) $(CAPK_STAMP) $(METALLB_STAMP):
	@mkdir -p $(dir $@) && touch $@

$(CLUSTERCTL_BIN)/capi/.complete:
	hack/fetch-clusterctl-assets.sh $(CLUSTERCTL_BIN)/capi $(CAPI_VERSION)

.PHONY: clusterctl
clusterctl: $(CLUSTERCTL_ASSETS) ## Build clusterctl (CLUSTERCTL_VERSION, the CAPI release) into CACHE_DIR and print its path.
	@echo $(CLUSTERCTL)

$(CONTROLLER_GEN):
	@$(call build_step,controller-gen $(CONTROLLER_GEN_VERSION),GOBIN=$(dir $@) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION))

$(KUSTOMIZE):
	@$(call build_step,kustomize $(KUSTOMIZE_VERSION),GOBIN=$(dir $@) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION))

$(GOLANGCI_LINT):
	@$(call build_step,golangci-lint $(GOLANGCI_LINT_VERSION),GOBIN=$(dir $@) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION))

.PHONY: tools
tools: $(CONTROLLER_GEN) $(KUSTOMIZE) $(GOLANGCI_LINT) ## Install controller-gen, kustomize and golangci-lint.
