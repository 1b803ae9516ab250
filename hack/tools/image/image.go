package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The manager's user: distroless's "nonroot" (65532:65532), which the Dockerfile's final
// stage (gcr.io/distroless/static:nonroot) runs as and the Deployment's securityContext names.
const (
	nonRootID   = 65532
	nonRootUser = "65532:65532"
	// ManagerPath is the manager binary in the image and the image's entrypoint.
	ManagerPath = "/manager"
)

// OCI annotation and label keys (the OCI image spec's pre-defined annotations).
const (
	labelSource   = "org.opencontainers.image.source"
	labelVersion  = "org.opencontainers.image.version"
	labelRevision = "org.opencontainers.image.revision"
	labelCreated  = "org.opencontainers.image.created"
	labelTitle    = "org.opencontainers.image.title"
	labelDesc     = "org.opencontainers.image.description"
	// RefNameAnnotation names an index in an OCI layout's index.json (the layout's "tag").
	RefNameAnnotation = "org.opencontainers.image.ref.name"
)

// Spec is everything an image is built from. The same Spec (and the same binaries) gives the
// same digests: file times, owners and the config's dates all come from Created, never from
// the clock or the build machine.
type Spec struct {
	// Binaries maps a platform ("linux/amd64", "linux/arm64") to the statically linked
	// manager built for it.
	Binaries map[string]string
	// Source, Version and Revision are the OCI labels: repository URL, release tag, commit.
	Source, Version, Revision string
	// Created is the image's creation time: SOURCE_DATE_EPOCH or the commit time.
	Created time.Time
}

// Platform is one image of the index, as built.
type Platform struct {
	Platform       v1.Platform
	Image          v1.Image
	Digest         v1.Hash
	CompressedSize int64 // the layer as pulled from a registry
	FilesSize      int64 // the files in the image, as unpacked on a node
}

// Build returns the multi-platform index of the manager image and its images.
func Build(spec Spec) (v1.ImageIndex, []Platform, error) {
	if len(spec.Binaries) == 0 {
		return nil, nil, fmt.Errorf("no manager binary given")
	}
	if spec.Created.IsZero() {
		return nil, nil, fmt.Errorf("no creation time given (SOURCE_DATE_EPOCH)")
	}
	names := make([]string, 0, len(spec.Binaries))
	for name := range spec.Binaries {
		names = append(names, name)
	}
	sort.Strings(names) // the index lists platforms in a fixed order

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.Annotations(idx, spec.labels()).(v1.ImageIndex)
	var built []Platform
	for _, name := range names {
		platform, err := parsePlatform(name)
		if err != nil {
			return nil, nil, err
		}
		img, filesSize, err := buildImage(spec, platform, spec.Binaries[name])
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return nil, nil, err
		}
		layers, err := img.Layers()
		if err != nil {
			return nil, nil, err
		}
		compressed, err := layers[0].Size()
		if err != nil {
			return nil, nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &platform},
		})
		built = append(built, Platform{Platform: platform, Image: img, Digest: digest, CompressedSize: compressed, FilesSize: filesSize})
	}
	return idx, built, nil
}

func (s Spec) labels() map[string]string {
	return map[string]string{
		labelTitle:    "cluster-api-addon-provider-guestnet",
		labelDesc:     "guestnet: Cluster API add-on provider for nested KubeVirt guest clusters (manager)",
		labelSource:   s.Source,
		labelVersion:  s.Version,
		labelRevision: s.Revision,
		labelCreated:  s.Created.UTC().Format(time.RFC3339),
	}
}

// parsePlatform reads "os/arch". arm64 images carry the variant v8, as Docker and the
// distroless images name it, so that every runtime matches them.
func parsePlatform(s string) (v1.Platform, error) {
	osName, arch, ok := strings.Cut(s, "/")
	if !ok || osName != "linux" || arch == "" || strings.Contains(arch, "/") {
		return v1.Platform{}, fmt.Errorf("platform %q: want linux/<arch>", s)
	}
	p := v1.Platform{OS: osName, Architecture: arch}
	if arch == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}

// buildImage is FROM scratch with one layer: the manager and the passwd/group entries of its
// user. No shell, no package manager, no CA bundle (see docs/install.md: the manager trusts
// only the CAs of the kubeconfigs it is given).
func buildImage(spec Spec, platform v1.Platform, binary string) (v1.Image, int64, error) {
	manager, err := os.ReadFile(binary)
	if err != nil {
		return nil, 0, err
	}
	layerTar, filesSize, err := rootFS(manager, spec.Created)
	if err != nil {
		return nil, 0, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, 0, err
	}

	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	created := v1.Time{Time: spec.Created.UTC()}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   created,
			CreatedBy: "hack/tools/image: " + ManagerPath + ", /etc/passwd, /etc/group",
			Comment:   "guestnet manager " + spec.Version,
		},
	})
	if err != nil {
		return nil, 0, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, 0, err
	}
	cfg = cfg.DeepCopy()
	cfg.Created = created
	cfg.OS, cfg.Architecture, cfg.Variant = platform.OS, platform.Architecture, platform.Variant
	cfg.Author = ""
	cfg.Config = v1.Config{
		User:       nonRootUser,
		Entrypoint: []string{ManagerPath},
		WorkingDir: "/",
		Labels:     spec.labels(),
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, 0, err
	}
	return img, filesSize, nil
}

// rootFS is the layer's tar: entries sorted, owners numeric, every time Created.
func rootFS(manager []byte, created time.Time) ([]byte, int64, error) {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonRootID, nonRootID)
	group := "root:x:0:\n" + fmt.Sprintf("nonroot:x:%d:\n", nonRootID)
	type entry struct {
		name     string
		mode     int64
		uid, gid int
		data     []byte
	}
	entries := []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: nonRootID, gid: nonRootID},
		{name: strings.TrimPrefix(ManagerPath, "/"), mode: 0o755, data: manager},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var size int64
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: created.UTC().Truncate(time.Second),
		}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
			size += h.Size
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, 0, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), size, nil
}
