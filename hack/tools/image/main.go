// Command image builds guestnet's manager image without a container engine, with
// go-containerregistry: FROM scratch plus the statically linked manager and its non-root user,
// one image per platform in a multi-platform OCI index, written as an OCI image layout and,
// for releases, as a tar archive of that layout. The Makefile runs it (`make image`,
// `make image-push`); docs/install.md describes the image.
//
//	image build --binary linux/amd64=bin/manager-linux-amd64 [--binary ...] --layout out/image \
//	    --tag v0.1.0 [--archive out/guestnet-image.oci.tar] --source URL --version v0.1.0 \
//	    --revision SHA [--created UNIX_SECONDS, default $SOURCE_DATE_EPOCH]
//	image push --layout out/image --tag v0.1.0 --to ghcr.io/guestnet/cluster-api-addon-provider-guestnet:v0.1.0
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: image build|push [flags]")
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:], out)
	case "push":
		return runPush(ctx, args[1:], out)
	default:
		return fmt.Errorf("unknown command %q: want build or push", args[0])
	}
}

// binaryFlags collects --binary os/arch=path.
type binaryFlags map[string]string

func (b binaryFlags) String() string { return fmt.Sprint(map[string]string(b)) }

func (b binaryFlags) Set(v string) error {
	platform, path, ok := strings.Cut(v, "=")
	if !ok || platform == "" || path == "" {
		return fmt.Errorf("want os/arch=path, got %q", v)
	}
	b[platform] = path
	return nil
}

func runBuild(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	binaries := binaryFlags{}
	fs.Var(binaries, "binary", "os/arch=path of the static manager binary for that platform (repeat per platform)")
	dir := fs.String("layout", "", "directory of the OCI image layout to write (replaced)")
	tag := fs.String("tag", "", "name of the index in the layout (org.opencontainers.image.ref.name)")
	archive := fs.String("archive", "", "also write the layout as this tar archive (oci-archive)")
	var spec Spec
	fs.StringVar(&spec.Source, "source", "", "label org.opencontainers.image.source: the repository URL")
	fs.StringVar(&spec.Version, "version", "", "label org.opencontainers.image.version: the release tag")
	fs.StringVar(&spec.Revision, "revision", "", "label org.opencontainers.image.revision: the commit")
	created := fs.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "creation time in Unix seconds (default $SOURCE_DATE_EPOCH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *tag == "" || spec.Source == "" || spec.Version == "" || spec.Revision == "" {
		return fmt.Errorf("build needs --layout, --tag, --source, --version and --revision")
	}
	seconds, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("--created (or SOURCE_DATE_EPOCH) %q is not Unix seconds", *created)
	}
	spec.Created = time.Unix(seconds, 0).UTC()
	spec.Binaries = binaries

	idx, platforms, err := Build(spec)
	if err != nil {
		return err
	}
	if err := WriteLayout(*dir, *tag, idx); err != nil {
		return fmt.Errorf("writing the OCI layout: %w", err)
	}
	for _, p := range platforms {
		fmt.Fprintf(out, "image %s/%s: %s, %.1f MB compressed, %.1f MB of files\n",
			p.Platform.OS, p.Platform.Architecture, p.Digest, mb(p.CompressedSize), mb(p.FilesSize))
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "image index %s: %s (OCI layout %s)\n", *tag, digest, *dir)
	if *archive != "" {
		if err := WriteArchive(*dir, *archive, spec.Created); err != nil {
			return fmt.Errorf("writing the archive: %w", err)
		}
		fmt.Fprintf(out, "image archive: %s\n", *archive)
	}
	return nil
}

func runPush(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	dir := fs.String("layout", "", "directory of the OCI image layout")
	tag := fs.String("tag", "", "name of the index in the layout")
	to := fs.String("to", "", "registry reference to push to, e.g. ghcr.io/guestnet/cluster-api-addon-provider-guestnet:v0.1.0")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *tag == "" || *to == "" {
		return fmt.Errorf("push needs --layout, --tag and --to")
	}
	digest, err := Push(ctx, *dir, *tag, *to)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "pushed %s@%s\n", *to, digest)
	return nil
}

func mb(n int64) float64 { return float64(n) / 1e6 }
