# syntax=docker/dockerfile:1
# The manager image, built the way Cluster API providers build theirs, for people with Docker
# (`make docker-build`; `docker buildx build --platform linux/amd64,linux/arm64 .` for both).
# `make image` builds the same image without Docker, from Go (hack/tools/image): the same
# binary flags, path, user, entrypoint and labels; docs/install.md compares the two, and
# hack/tools/image/dockerfile_test.go checks it with BuildKit's own Dockerfile parser.

ARG GO_VERSION=1.26
# Cross-compiled on the builder's own platform: Go needs no emulation to build for another.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS builder
WORKDIR /workspace

ARG goproxy=https://proxy.golang.org
ENV GOPROXY=$goproxy

# Modules first, in their own cache, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY main.go ./
COPY api/ api/
COPY controllers/ controllers/
COPY exp/ exp/
COPY internal/ internal/

# Static (no libc in the final image), no local paths, no build id or VCS stamp: the flags of
# `make image` (MANAGER_GOFLAGS, MANAGER_LDFLAGS in the Makefile).
ARG TARGETOS
ARG TARGETARCH
ARG ldflags="-s -w -buildid="
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags "${ldflags}" -o manager .

FROM gcr.io/distroless/static:nonroot
ARG source=https://github.com/guestnet/cluster-api-addon-provider-guestnet
ARG version=dev
ARG revision=unknown
LABEL org.opencontainers.image.title="cluster-api-addon-provider-guestnet" \
      org.opencontainers.image.description="guestnet: Cluster API add-on provider for nested KubeVirt guest clusters (manager)" \
      org.opencontainers.image.source="${source}" \
      org.opencontainers.image.version="${version}" \
      org.opencontainers.image.revision="${revision}"
WORKDIR /
COPY --from=builder /workspace/manager /manager
# distroless's nonroot user; the Deployment runs as it too (runAsUser/runAsGroup 65532).
USER 65532:65532
ENTRYPOINT ["/manager"]
