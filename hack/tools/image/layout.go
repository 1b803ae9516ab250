package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// WriteLayout replaces dir with an OCI image layout whose index.json names idx as tag
// (annotation org.opencontainers.image.ref.name): what `podman pull oci:DIR:TAG`,
// `skopeo copy --all oci:DIR:TAG ...` and `crane push --index DIR ...` read.
func WriteLayout(dir, tag string, idx v1.ImageIndex) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefNameAnnotation: tag})); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// ReadLayout returns the index that the layout in dir names tag.
func ReadLayout(dir, tag string) (v1.ImageIndex, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	root, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := root.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Annotations[RefNameAnnotation] == tag {
			return root.ImageIndex(d.Digest)
		}
	}
	return nil, fmt.Errorf("the OCI layout %s has no index named %q", dir, tag)
}

// WriteArchive writes the layout in dir as a tar archive (the oci-archive format of podman
// and skopeo), byte for byte the same for the same layout: entries sorted, numeric owners 0,
// fixed modes, and every time set to modTime.
func WriteArchive(dir, archive string, modTime time.Time) (err error) {
	var paths []string
	err = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)

	tmp := archive + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	tw := tar.NewWriter(f)
	for _, path := range paths {
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: modTime.UTC().Truncate(time.Second)}
		switch {
		case info.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case info.Mode().IsRegular():
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, info.Size()
		default:
			return fmt.Errorf("%s: not a file or directory", path)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if err := copyFile(tw, path); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, archive)
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
