package main

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push copies the index that the layout in dir names tag, with its images, to the registry
// reference to (e.g. ghcr.io/guestnet/cluster-api-addon-provider-guestnet:v0.1.0), with the
// credentials of the Docker config (`docker login`, `crane auth login`, `podman login
// --authfile ~/.docker/config.json`). The registry gets the very digest built here.
func Push(ctx context.Context, dir, tag, to string) (v1.Hash, error) {
	idx, err := ReadLayout(dir, tag)
	if err != nil {
		return v1.Hash{}, err
	}
	ref, err := name.ParseReference(to)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image reference %q: %w", to, err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing to %s: %w", ref, err)
	}
	return idx.Digest()
}
