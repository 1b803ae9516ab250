package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const testCreated = "1796116402" // 2026-12-01T09:13:22Z

// fakeBinaries writes a stand-in "manager" per platform (the real one takes minutes to
// build; e2e/image_test.go runs the real image).
func fakeBinaries(t *testing.T, content string) []string {
	t.Helper()
	dir := t.TempDir()
	var args []string
	for _, p := range []string{"linux/arm64", "linux/amd64"} {
		path := filepath.Join(dir, strings.ReplaceAll(p, "/", "-"))
		if err := os.WriteFile(path, []byte(content+" for "+p), 0o755); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--binary", p+"="+path)
	}
	return args
}

// build runs `image build` into a new directory and returns the layout and archive paths
// and what the command printed.
func build(t *testing.T, binaries []string, extra ...string) (layoutDir, archive, out string) {
	t.Helper()
	dir := t.TempDir()
	layoutDir, archive = filepath.Join(dir, "layout"), filepath.Join(dir, "image.oci.tar")
	args := append([]string{"build", "--layout", layoutDir, "--archive", archive, "--tag", "v0.1.0",
		"--source", "https://github.com/guestnet/cluster-api-addon-provider-guestnet",
		"--version", "v0.1.0", "--revision", "0123456789abcdef", "--created", testCreated}, binaries...)
	args = append(args, extra...)
	var buf bytes.Buffer
	if err := run(context.Background(), args, &buf); err != nil {
		t.Fatalf("image %s: %v", strings.Join(args, " "), err)
	}
	return layoutDir, archive, buf.String()
}

func indexDigest(t *testing.T, layoutDir string) v1.Hash {
	t.Helper()
	idx, err := ReadLayout(layoutDir, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(data))
}

func TestBuild_SameInputsGiveTheSameDigests(t *testing.T) {
	bins := fakeBinaries(t, "manager")
	layout1, archive1, out1 := build(t, bins)
	// A second build, later, from binaries at other paths with the same content.
	time.Sleep(1100 * time.Millisecond)
	layout2, archive2, out2 := build(t, fakeBinaries(t, "manager"))

	if d1, d2 := indexDigest(t, layout1), indexDigest(t, layout2); d1 != d2 {
		t.Errorf("two builds of the same inputs: index %s and %s", d1, d2)
	}
	if a1, a2 := fileDigest(t, archive1), fileDigest(t, archive2); a1 != a2 {
		t.Errorf("two builds of the same inputs: archives sha256 %s and %s", a1, a2)
	}
	if strings.ReplaceAll(out1, layout1, "") != strings.ReplaceAll(out2, layout2, "") {
		t.Logf("outputs differ beyond the paths:\n%s\n%s", out1, out2)
	}

	// Every input changes the digest.
	base := indexDigest(t, layout1)
	for what, l := range map[string]string{
		"binary":   func() string { l, _, _ := build(t, fakeBinaries(t, "other manager")); return l }(),
		"revision": func() string { l, _, _ := build(t, bins, "--revision", "fedcba9876543210"); return l }(),
		"created":  func() string { l, _, _ := build(t, bins, "--created", "1796116403"); return l }(),
	} {
		if indexDigest(t, l) == base {
			t.Errorf("another %s gave the same digest %s", what, base)
		}
	}
}

func TestBuild_ImagesAreTheManagerAndItsNonRootUserOnly(t *testing.T) {
	layoutDir, _, out := build(t, fakeBinaries(t, "manager"))
	t.Log(out)
	idx, err := ReadLayout(layoutDir, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s", m.MediaType)
	}
	if got := m.Annotations[labelRevision]; got != "0123456789abcdef" {
		t.Errorf("index annotation %s = %q", labelRevision, got)
	}
	var platforms []string
	for _, d := range m.Manifests {
		platforms = append(platforms, d.Platform.String())
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != d.Platform.Architecture || cfg.OS != "linux" || cfg.Variant != d.Platform.Variant {
			t.Errorf("%s: config says %s/%s/%s", d.Platform, cfg.OS, cfg.Architecture, cfg.Variant)
		}
		c := cfg.Config
		if c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/manager" || len(c.Cmd) != 0 || c.WorkingDir != "/" {
			t.Errorf("%s: user %q entrypoint %q cmd %q workdir %q", d.Platform, c.User, c.Entrypoint, c.Cmd, c.WorkingDir)
		}
		want := map[string]string{
			labelSource:   "https://github.com/guestnet/cluster-api-addon-provider-guestnet",
			labelVersion:  "v0.1.0",
			labelRevision: "0123456789abcdef",
			labelCreated:  "2026-12-01T09:13:22Z",
		}
		for k, v := range want {
			if c.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", d.Platform, k, c.Labels[k], v)
			}
		}
		if got := cfg.Created.UTC().Format(time.RFC3339); got != "2026-12-01T09:13:22Z" {
			t.Errorf("%s: created %s", d.Platform, got)
		}

		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		if len(layers) != 1 {
			t.Fatalf("%s: %d layers, want 1", d.Platform, len(layers))
		}
		files := layerFiles(t, layers[0])
		wantFiles := []string{
			"etc/ 0755 0:0", "etc/group 0644 0:0", "etc/passwd 0644 0:0", "home/ 0755 0:0",
			"home/nonroot/ 0700 65532:65532", "manager 0755 0:0",
		}
		if strings.Join(files, "\n") != strings.Join(wantFiles, "\n") {
			t.Errorf("%s: layer holds\n%s\nwant\n%s", d.Platform, strings.Join(files, "\n"), strings.Join(wantFiles, "\n"))
		}
	}
	sort.Strings(platforms)
	if strings.Join(platforms, " ") != "linux/amd64 linux/arm64/v8" {
		t.Errorf("platforms %v", platforms)
	}
}

// layerFiles lists "name mode uid:gid" of a layer, and checks the passwd entry of the user
// and that every time is the creation time.
func layerFiles(t *testing.T, l v1.Layer) []string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var files []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fmt.Sprintf("%s %04o %d:%d", h.Name, h.Mode, h.Uid, h.Gid))
		if got := h.ModTime.UTC().Format(time.RFC3339); got != "2026-12-01T09:13:22Z" {
			t.Errorf("%s: mtime %s", h.Name, got)
		}
		if h.Name == "etc/passwd" {
			data, _ := io.ReadAll(tr)
			if !strings.Contains(string(data), "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") {
				t.Errorf("/etc/passwd lacks the nonroot user:\n%s", data)
			}
		}
	}
	return files
}

func TestReadLayout_UnknownTag(t *testing.T) {
	layoutDir, _, _ := build(t, fakeBinaries(t, "manager"))
	if _, err := ReadLayout(layoutDir, "v9.9.9"); err == nil || !strings.Contains(err.Error(), `no index named "v9.9.9"`) {
		t.Errorf("err = %v", err)
	}
}

// The push a release does (`make image-push`), to a registry on loopback
// (go-containerregistry's in-memory registry): the registry serves the very index built here,
// with both platforms.
func TestPush_TheRegistryServesTheDigestBuiltHere(t *testing.T) {
	layoutDir, _, _ := build(t, fakeBinaries(t, "manager"))
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	if !strings.HasPrefix(host, "127.0.0.1:") {
		t.Fatalf("registry on %s, want loopback", host)
	}
	ref := host + "/guestnet/cluster-api-addon-provider-guestnet:v0.1.0"

	var out bytes.Buffer
	if err := run(context.Background(), []string{"push", "--layout", layoutDir, "--tag", "v0.1.0", "--to", ref}, &out); err != nil {
		t.Fatal(err)
	}
	want := indexDigest(t, layoutDir)
	if !strings.Contains(out.String(), "@"+want.String()) {
		t.Errorf("push printed %q, want the digest %s", out.String(), want)
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Index(parsed)
	if err != nil {
		t.Fatal(err)
	}
	gotDigest, err := got.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if gotDigest != want {
		t.Errorf("registry serves %s, built %s", gotDigest, want)
	}
	for _, p := range []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}} {
		img, err := remote.Image(parsed, remote.WithPlatform(p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		cfg, err := img.ConfigFile()
		if err != nil || cfg.Config.User != "65532:65532" {
			t.Errorf("%s: config %v, err %v", p, cfg, err)
		}
	}
}
