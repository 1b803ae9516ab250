package e2e

// The manager image and the release, as users get them (docs/install.md). `make test` builds
// both from the working tree first (`make release`, which runs `make image`); these tests
// read what it wrote (GUESTNET_IMAGE_LAYOUT, GUESTNET_IMAGE_ARCHIVE, GUESTNET_RELEASE_DIR):
//   - the image's config, files and size, for every platform, read from the OCI layout;
//   - the image run by a real container runtime (podman with runc, as Debian ships them) the
//     way the release's Deployment runs it: its args, its ServiceAccount and RBAC, its
//     securityContext (non-root, read-only root filesystem, no capabilities), against the
//     lab's host apiserver, in the lab's network namespace; it reconciles a GuestIngress, and
//     `manager diagnose` runs from the image;
//   - the release directory: every file, SHA256SUMS, the components naming the image.
//
// hack/tools/image's own tests check the Dockerfile against the image it builds, and the
// image's reproducibility.
//
// Run with: make test TEST_PKGS=./e2e/... TEST_ARGS='-run "Image|Release|Workflows" -v'

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/diagnose"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeagent"
)

// What the image must be (the Dockerfile's USER and ENTRYPOINT; the Deployment's runAsUser).
const (
	imageUser       = "65532:65532"
	imageEntrypoint = "/manager"
	// Generous bounds: the manager is about 60 MB of files, 22 MB compressed (make image
	// prints the figures). A jump past these means something heavy got into the binary
	// (docs/install.md).
	maxImageCompressedBytes = 60e6
	maxImageFilesBytes      = 120e6
	imageTimeout            = 3 * time.Minute
)

// imagePlatforms are the platforms make built the image for (GUESTNET_IMAGE_PLATFORMS: make
// test builds this machine's only, make release every IMAGE_PLATFORMS), as the index names
// them: arm64 with its variant.
func imagePlatforms() []string {
	built := strings.Fields(os.Getenv("GUESTNET_IMAGE_PLATFORMS"))
	if len(built) == 0 {
		built = []string{"linux/amd64", "linux/arm64"}
	}
	var out []string
	for _, p := range built {
		if p == "linux/arm64" {
			p += "/v8"
		}
		out = append(out, p)
	}
	return out
}

func TestImage_IsTheStaticManagerAloneRunningAsNonRoot(t *testing.T) {
	g := NewWithT(t)
	a := requireImageArtifacts(t)
	img := readOCILayout(t, dirBlobs(a.layout), a.tag)

	g.Expect(img.index.MediaType).To(Equal("application/vnd.oci.image.index.v1+json"))
	var platforms []string
	for _, p := range img.images {
		platforms = append(platforms, p.platform)
		cfg := p.config
		g.Expect(cfg.OS + "/" + cfg.Architecture + variantSuffix(cfg.Variant)).To(Equal(p.platform))
		g.Expect(cfg.Config.User).To(Equal(imageUser), "%s: the user", p.platform)
		g.Expect(cfg.Config.Entrypoint).To(Equal([]string{imageEntrypoint}), "%s: the entrypoint", p.platform)
		g.Expect(cfg.Config.Cmd).To(BeEmpty(), "%s: the command", p.platform)
		g.Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.source", "https://github.com/guestnet/cluster-api-addon-provider-guestnet"))
		g.Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.version", a.tag))
		g.Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.revision", MatchRegexp("^[0-9a-f]{40}$")))
		g.Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.created", cfg.Created))

		// One layer: the manager and its user's passwd/group entries. No shell, nothing else.
		g.Expect(p.layers).To(HaveLen(1))
		files, manager, filesSize := layerEntries(t, p.layers[0].data)
		g.Expect(files).To(Equal([]string{
			"etc/ 0755 0:0", "etc/group 0644 0:0", "etc/passwd 0644 0:0",
			"home/ 0755 0:0", "home/nonroot/ 0700 65532:65532", "manager 0755 0:0",
		}), "%s: the image's files", p.platform)
		checkStaticBinary(t, manager, cfg.Architecture)

		compressed := p.manifestSize + p.configSize + p.layers[0].size
		// A benchmark-style figure, not a timed assertion.
		t.Logf("BenchmarkImageSize/%s\t%.1f MB compressed\t%.1f MB of files", p.platform, float64(compressed)/1e6, float64(filesSize)/1e6)
		g.Expect(compressed).To(BeNumerically("<", maxImageCompressedBytes), "%s: compressed size", p.platform)
		g.Expect(filesSize).To(BeNumerically("<", maxImageFilesBytes), "%s: files size", p.platform)
	}
	g.Expect(platforms).To(ConsistOf(imagePlatforms()))
}

// The manager as the release's Deployment runs it, from the image, under podman.
func TestImage_RunsTheReleaseDeploymentUnderPodman(t *testing.T) {
	g := NewWithT(t)
	a := requireImageArtifacts(t)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	host := l.Host.Client
	pm := newPodman(t)

	// The release's components: the Deployment names the image built here.
	components := readReleaseComponents(t, a.releaseDir)
	deployment := releaseDeployment(t, components)
	container := deployment.Spec.Template.Spec.Containers[0]
	g.Expect(container.Image).To(Equal(a.releaseImage))
	sc := container.SecurityContext
	g.Expect(sc).NotTo(BeNil())
	g.Expect(fmt.Sprintf("%d:%d", ptr.Deref(sc.RunAsUser, -1), ptr.Deref(sc.RunAsGroup, -1))).To(Equal(imageUser),
		"the Deployment's runAsUser/runAsGroup are the image's user")
	g.Expect(container.Command).To(Equal([]string{imageEntrypoint}))

	// The image from the release archive, tagged as the Deployment names it (as a node that
	// pulled it from the registry has it).
	id := strings.TrimSpace(pm.mustRun(ctx, "pull", "--quiet", "--signature-policy", pm.policy, "oci-archive:"+a.archive+":"+a.tag))
	pm.mustRun(ctx, "tag", id, a.releaseImage)
	var inspected []struct {
		User   string
		Size   int64
		Config struct {
			Entrypoint []string
			Labels     map[string]string
		}
	}
	g.Expect(json.Unmarshal([]byte(pm.mustRun(ctx, "image", "inspect", a.releaseImage)), &inspected)).To(Succeed())
	g.Expect(inspected).To(HaveLen(1))
	g.Expect(inspected[0].User).To(Equal(imageUser))
	g.Expect(inspected[0].Config.Entrypoint).To(Equal([]string{imageEntrypoint}))
	g.Expect(inspected[0].Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.version", a.tag))
	t.Logf("BenchmarkImageSize/podman\t%.1f MB (podman image inspect)", float64(inspected[0].Size)/1e6)

	// The guest cluster, its ingress controller's Service and a worker VM running Envoy, a
	// Cilium stand-in, and a GuestIngressPolicy admitting the GuestIngress (guestnet creates
	// nothing on the host for a GuestIngress no policy admits).
	ns := uniqueName("image")
	const httpNodePort, httpsNodePort int32 = 31414, 31415
	const ip = "10.98.74.10"
	startCiliumStandIn(t, l)
	gc := createIngressCluster(t, l, ns, "tenant-a", httpNodePort, httpsNodePort)
	addEnvoyWorker(t, l, gc, ns+"-md-0-a", "10.244.74.11", httpNodePort, httpsNodePort)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	createAdmittingPolicy(t, l, ns, ip)

	// The Deployment's identity in the test's namespace: its ServiceAccount and RBAC from
	// the components file, and a token as the kubelet mounts one.
	saDir := installReleaseRBAC(t, l, components, ns, deployment.Spec.Template.Spec.ServiceAccountName)

	// The Deployment's pod, as podman runs it: its args (clusterctl's variable defaults) plus
	// --namespace, so that it reconciles only this test's objects in the shared lab; its
	// securityContext; the in-cluster config of a pod; the lab's network namespace.
	args := append(clusterctlDefaults(container.Args), "--namespace="+ns)
	name := ns + "-manager"
	runArgs := []string{"run", "--detach", "--name", name, "--pull=never", "--log-driver=k8s-file",
		"--network=host", "--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096",
		"--entrypoint=" + mustJSON(t, container.Command),
		"--volume=" + saDir + ":/var/run/secrets/kubernetes.io/serviceaccount:ro",
		"--env=KUBERNETES_SERVICE_HOST=" + lab.HostAPIServerAddress, "--env=KUBERNETES_SERVICE_PORT=6443",
	}
	runArgs = append(runArgs, securityContextFlags(t, sc)...)
	runArgs = append(append(runArgs, a.releaseImage), args...)
	pm.mustRun(ctx, runArgs...)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := pm.run(context.Background(), "logs", "--tail=60", name)
			t.Logf("manager container log, last lines:\n%s", out)
		}
		_, _ = pm.run(context.Background(), "rm", "--force", "--time=0", name)
	})
	state := strings.Fields(pm.mustRun(ctx, "inspect", "--format={{.State.Pid}} {{.State.Status}} {{.State.ExitCode}} {{.State.Error}}", name))
	pid, err := strconv.Atoi(state[0])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pid).To(BeNumerically(">", 0), "the container is not running: state %v", state[1:])
	checkContainerProcess(t, l, pid)

	// Ready: the readiness probe of the Deployment answers.
	probe := container.ReadinessProbe
	g.Expect(probe).NotTo(BeNil())
	g.Expect(probe.HTTPGet).NotTo(BeNil())
	readyURL := fmt.Sprintf("http://127.0.0.1:%d%s", containerPort(t, container, probe.HTTPGet.Port.String()), probe.HTTPGet.Path)
	g.Eventually(func() error { return httpGetOK(ctx, readyURL) }).WithTimeout(imageTimeout).WithPolling(time.Second).
		Should(Succeed(), "the manager in the container answers %s", readyURL)
	healthURL := fmt.Sprintf("http://127.0.0.1:%d%s", containerPort(t, container, container.LivenessProbe.HTTPGet.Port.String()), container.LivenessProbe.HTTPGet.Path)
	g.Expect(httpGetOK(ctx, healthURL)).To(Succeed())

	// It is the leader (its lease, held by the container's hostname, in its namespace).
	hostname := strings.TrimSpace(pm.mustRun(ctx, "inspect", "--format={{.Config.Hostname}}", name))
	g.Eventually(func(g Gomega) {
		leases := &coordinationv1.LeaseList{}
		g.Expect(host.List(ctx, leases, client.InNamespace(ns))).To(Succeed())
		g.Expect(leases.Items).To(HaveLen(1))
		g.Expect(ptr.Deref(leases.Items[0].Spec.HolderIdentity, "")).To(HavePrefix(hostname + "_"))
	}).WithTimeout(imageTimeout).Should(Succeed())

	// It reconciles a GuestIngress: finalizer, Ready, and a request through the IP reaches Envoy
	// in the worker VM.
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, ip, ptr.To(httpNodePort), ptr.To(httpsNodePort))
	got := eventuallyGuestIngressReady(t, l, gi)
	g.Expect(got.Finalizers).To(ContainElement(guestnetv1.GuestIngressFinalizer))
	g.Expect(conditions.IsTrue(got, guestnetv1.AdmittedCondition) || conditions.Get(got, guestnetv1.AdmittedCondition) == nil).To(BeTrue(),
		"Admitted: %v", conditions.Get(got, guestnetv1.AdmittedCondition))
	g.Eventually(func() []string { return machinesBehind(ctx, ip, 80, 3) }).WithTimeout(imageTimeout).
		Should(Equal([]string{ns + "-md-0-a"}))

	// `manager diagnose` from the image, as an operator runs it with their kubeconfig.
	kubeconfigDir := readableDir(t, map[string][]byte{"config": l.Host.Kubeconfig})
	out, code := pm.runExit(ctx, "run", "--rm", "--pull=never", "--network=host", "--read-only", "--read-only-tmpfs=false",
		"--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096", "--volume="+kubeconfigDir+":/kube:ro",
		a.releaseImage, "diagnose", "--kubeconfig=/kube/config", "--namespace="+ns, "--cluster="+gc.Name, "--output=json")
	rep := &diagnose.Report{}
	g.Expect(json.Unmarshal([]byte(out), rep)).To(Succeed(), "diagnose printed:\n%s", out)
	g.Expect(code).To(Equal(map[diagnose.Verdict]int{diagnose.OK: diagnose.ExitOK, diagnose.Warn: diagnose.ExitOK, diagnose.Fail: diagnose.ExitFail}[rep.Verdict]),
		"exit status of diagnose for verdict %s", rep.Verdict)
	g.Expect(rep.Cluster).To(Equal(gc.Name))
	r := result(t, rep, diagnose.CheckGuestIngress, "web")
	g.Expect(r.Verdict).To(Equal(diagnose.OK), r.Detail)
	g.Expect(r.Detail).To(ContainSubstring("Ready: IP " + ip))

	// Deleted while the container's manager runs: it removes its finalizer.
	g.Expect(host.Delete(ctx, gi)).To(Succeed())
	g.Eventually(func() bool { return apierrors.IsNotFound(host.Get(ctx, client.ObjectKeyFromObject(gi), gi)) }).
		WithTimeout(imageTimeout).Should(BeTrue(), "the GuestIngress is deleted")

	// A clean stop: SIGTERM, exit status 0 (nothing failed on the read-only filesystem).
	pm.mustRun(ctx, "stop", "--time=60", name)
	g.Expect(strings.TrimSpace(pm.mustRun(ctx, "inspect", "--format={{.State.ExitCode}}", name))).To(Equal("0"))
}

// `make release` writes every file of a GitHub release, and SHA256SUMS lists and verifies them.
func TestRelease_HoldsEveryFileWithItsChecksum(t *testing.T) {
	g := NewWithT(t)
	a := requireImageArtifacts(t)
	sums, err := os.ReadFile(filepath.Join(a.releaseDir, "SHA256SUMS"))
	g.Expect(err).NotTo(HaveOccurred(), "run make release")
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, file, ok := strings.Cut(line, "  ")
		g.Expect(ok).To(BeTrue(), "SHA256SUMS line %q", line)
		data, err := os.ReadFile(filepath.Join(a.releaseDir, file))
		g.Expect(err).NotTo(HaveOccurred())
		got := sha256.Sum256(data)
		g.Expect(hex.EncodeToString(got[:])).To(Equal(sum), "checksum of %s", file)
		files = append(files, file)
	}
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	want := []string{"addon-components.yaml", "metadata.yaml", "admission-policies.yaml", filepath.Base(a.archive)}
	templates, err := filepath.Glob(filepath.Join(root, "templates", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(templates).NotTo(BeEmpty())
	for _, tmpl := range templates {
		want = append(want, filepath.Base(tmpl))
	}
	g.Expect(files).To(ConsistOf(want))

	// The components name the image of the release tag, and the archive holds it: the same
	// index as the layout `make image` wrote, for every platform.
	g.Expect(releaseDeployment(t, readReleaseComponents(t, a.releaseDir)).Spec.Template.Spec.Containers[0].Image).
		To(Equal(a.releaseImage))
	g.Expect(a.releaseImage).To(HaveSuffix(":" + a.tag))
	fromArchive := readOCILayout(t, tarBlobs(t, a.archive), a.tag)
	fromLayout := readOCILayout(t, dirBlobs(a.layout), a.tag)
	g.Expect(fromArchive.digest).To(Equal(fromLayout.digest))
	var platforms []string
	for _, p := range fromArchive.images {
		platforms = append(platforms, p.platform)
	}
	g.Expect(platforms).To(ConsistOf(imagePlatforms()))
	t.Logf("image index %s: %s", a.tag, fromArchive.digest)
}

// The GitHub Actions workflows cannot run here: they only call make targets that `make test`
// tests (test itself; release by TestRelease_*; image-push by hack/tools/image's
// TestPush_TheRegistryServesTheDigestBuiltHere), with GitHub's own actions.
func TestWorkflows_AreThinWrappersOverTestedMakeTargets(t *testing.T) {
	g := NewWithT(t)
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	g.Expect(err).NotTo(HaveOccurred())
	tested := []string{"test", "release", "image-push"}
	want := map[string][]string{"ci.yaml": {"test"}, "release.yaml": {"release", "image-push"}}
	makeCall := regexp.MustCompile(`(?m)^\s*(?:sudo .*)?\bmake ([a-z][a-z0-9-]*)`)
	for file, targets := range want {
		data, err := os.ReadFile(filepath.Join(root, ".github", "workflows", file))
		g.Expect(err).NotTo(HaveOccurred())
		var wf struct {
			Jobs map[string]struct {
				Steps []struct {
					Uses string `json:"uses"`
					Run  string `json:"run"`
				} `json:"steps"`
			} `json:"jobs"`
		}
		g.Expect(yaml.Unmarshal(data, &wf)).To(Succeed(), file)
		var called []string
		for _, job := range wf.Jobs {
			for _, step := range job.Steps {
				if step.Uses != "" {
					g.Expect(step.Uses).To(MatchRegexp(`^actions/(checkout|setup-go|cache)@v[0-9]+$`), "%s: only GitHub's own actions", file)
				}
				for _, m := range makeCall.FindAllStringSubmatch(step.Run, -1) {
					called = append(called, m[1])
				}
			}
		}
		g.Expect(called).To(Equal(targets), "%s calls make", file)
		for _, target := range called {
			g.Expect(tested).To(ContainElement(target), "%s: make %s is not tested here", file, target)
			g.Expect(string(makefile)).To(MatchRegexp(`(?m)^`+regexp.QuoteMeta(target)+`:`), "the Makefile has %s", target)
		}
	}
}

// --- helpers ------------------------------------------------------------------------------

type imageArtifacts struct {
	layout, archive, tag     string
	releaseDir, releaseImage string
}

// requireImageArtifacts returns where `make image` and `make release` wrote the image and the
// release; outside `make test` the test is skipped (failed under CI).
func requireImageArtifacts(t *testing.T) imageArtifacts {
	t.Helper()
	a := imageArtifacts{
		layout: os.Getenv("GUESTNET_IMAGE_LAYOUT"), archive: os.Getenv("GUESTNET_IMAGE_ARCHIVE"),
		tag: os.Getenv("GUESTNET_RELEASE_TAG"), releaseDir: os.Getenv("GUESTNET_RELEASE_DIR"),
		releaseImage: os.Getenv("GUESTNET_RELEASE_IMAGE"),
	}
	if a.layout == "" || a.archive == "" || a.tag == "" || a.releaseDir == "" || a.releaseImage == "" {
		lab.RequireLab(t) // same rule: skip outside `make test`, fail under CI
		t.Skip("the image and release variables are not set; run with `make test`")
	}
	for _, p := range []string{filepath.Join(a.layout, "index.json"), a.archive} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: run `make release` (make test does)", err)
		}
	}
	return a
}

// ociLayout is what a test reads of an OCI image layout: the index a tag names and its images.
type ociLayout struct {
	digest string
	index  ociIndex
	images []ociImage
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant,omitempty"`
	} `json:"platform,omitempty"`
}

type ociIndex struct {
	MediaType string          `json:"mediaType"`
	Manifests []ociDescriptor `json:"manifests"`
}

type ociImage struct {
	platform                 string
	manifestSize, configSize int64
	config                   ociConfig
	layers                   []ociLayer
}

type ociLayer struct {
	size int64
	data []byte // uncompressed tar
}

type ociConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant"`
	Created      string `json:"created"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		WorkingDir string            `json:"WorkingDir"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// blobReader reads a file of a layout by its path in the layout ("index.json", "blobs/...").
type blobReader func(path string) ([]byte, error)

func dirBlobs(dir string) blobReader {
	return func(path string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, path)) }
}

// tarBlobs reads a layout from its tar archive (the oci-archive format).
func tarBlobs(t *testing.T, archive string) blobReader {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", archive, err)
		}
		if h.Typeflag == tar.TypeReg {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return func(path string) ([]byte, error) {
		if data, ok := files[path]; ok {
			return data, nil
		}
		return nil, fmt.Errorf("%s: no %s", archive, path)
	}
}

// readOCILayout reads the index that the layout names tag, checking every blob's digest.
func readOCILayout(t *testing.T, read blobReader, tag string) ociLayout {
	t.Helper()
	blob := func(d ociDescriptor) []byte {
		t.Helper()
		hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
		if !ok {
			t.Fatalf("digest %q is not sha256", d.Digest)
		}
		data, err := read("blobs/sha256/" + hexDigest)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) != hexDigest || int64(len(data)) != d.Size {
			t.Fatalf("blob %s does not match its descriptor", d.Digest)
		}
		return data
	}
	unmarshal := func(data []byte, into any) {
		t.Helper()
		if err := json.Unmarshal(data, into); err != nil {
			t.Fatal(err)
		}
	}

	indexJSON, err := read("index.json")
	if err != nil {
		t.Fatal(err)
	}
	var root ociIndex
	unmarshal(indexJSON, &root)
	var out ociLayout
	for _, d := range root.Manifests {
		if d.Annotations["org.opencontainers.image.ref.name"] == tag {
			out.digest = d.Digest
			unmarshal(blob(d), &out.index)
		}
	}
	if out.digest == "" {
		t.Fatalf("the OCI layout names no index %s", tag)
	}
	for _, d := range out.index.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		img := ociImage{
			platform:     d.Platform.OS + "/" + d.Platform.Architecture + variantSuffix(d.Platform.Variant),
			manifestSize: d.Size,
		}
		var manifest struct {
			Config ociDescriptor   `json:"config"`
			Layers []ociDescriptor `json:"layers"`
		}
		unmarshal(blob(d), &manifest)
		unmarshal(blob(manifest.Config), &img.config)
		img.configSize = manifest.Config.Size
		for _, ld := range manifest.Layers {
			if ld.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
				t.Fatalf("layer %s: media type %s", ld.Digest, ld.MediaType)
			}
			img.layers = append(img.layers, ociLayer{size: ld.Size, data: gunzip(t, blob(ld))})
		}
		out.images = append(out.images, img)
	}
	return out
}

func variantSuffix(v string) string {
	if v == "" {
		return ""
	}
	return "/" + v
}

// layerEntries lists "name mode uid:gid" of a layer's tar, and returns the manager's bytes
// and the size of all files.
func layerEntries(t *testing.T, layer []byte) ([]string, []byte, int64) {
	t.Helper()
	var entries []string
	var manager []byte
	var size int64
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, fmt.Sprintf("%s %04o %d:%d", h.Name, h.Mode, h.Uid, h.Gid))
		size += h.Size
		if "/"+h.Name == imageEntrypoint {
			if manager, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	sort.Strings(entries)
	return entries, manager, size
}

// checkStaticBinary: an ELF executable for the architecture, with no dynamic loader (a
// scratch image has no libc).
func checkStaticBinary(t *testing.T, data []byte, arch string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the manager is not an ELF binary: %v", err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != want {
		t.Errorf("the %s manager is built for %s", arch, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the %s manager is linked dynamically (it has an ELF interpreter): build it with CGO_ENABLED=0", arch)
		}
	}
}

func gunzip(t *testing.T, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("gunzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gunzip: %v", err)
	}
	return out
}

func readReleaseComponents(t *testing.T, releaseDir string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(releaseDir, "addon-components.yaml"))
	if err != nil {
		t.Fatalf("%v: run `make release-manifests`", err)
	}
	objs, err := lab.DecodeObjects(data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func releaseDeployment(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			d := &appsv1.Deployment{}
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
				t.Fatal(err)
			}
			if len(d.Spec.Template.Spec.Containers) != 1 {
				t.Fatalf("the Deployment has %d containers", len(d.Spec.Template.Spec.Containers))
			}
			return d
		}
	}
	t.Fatal("the components have no Deployment")
	return nil
}

var clusterctlVariable = regexp.MustCompile(`\$\{[A-Za-z0-9_]+:=([^}]*)\}`)

// clusterctlDefaults replaces every ${VAR:=default} by its default, as clusterctl does when
// VAR is not set.
func clusterctlDefaults(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = clusterctlVariable.ReplaceAllString(a, "$1")
	}
	return out
}

// installReleaseRBAC creates the components' ServiceAccount and RBAC for the namespace ns
// (cluster-scoped objects renamed per test, removed at the end) and returns a directory laid
// out as the kubelet mounts a ServiceAccount token: token, ca.crt, namespace.
func installReleaseRBAC(t *testing.T, l *lab.Lab, objs []*unstructured.Unstructured, ns, serviceAccount string) string {
	t.Helper()
	ctx := testContext(t)
	host := l.Host.Client
	g := NewWithT(t)
	g.Expect(client.IgnoreAlreadyExists(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))).To(Succeed())
	renamed := map[string]string{} // cluster-scoped names
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
			renamed[o.GetName()] = ns + "-" + o.GetName()
		}
	}
	found := false
	for _, src := range objs {
		switch src.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
		default:
			continue
		}
		o := src.DeepCopy()
		if n, ok := renamed[o.GetName()]; ok && (o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding") {
			o.SetName(n)
		} else {
			o.SetNamespace(ns)
		}
		if o.GetKind() == "ServiceAccount" && o.GetName() == serviceAccount {
			found = true
		}
		if strings.HasSuffix(o.GetKind(), "Binding") {
			if ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name"); renamed[ref] != "" {
				g.Expect(unstructured.SetNestedField(o.Object, renamed[ref], "roleRef", "name")).To(Succeed())
			}
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				s.(map[string]any)["namespace"] = ns
			}
			g.Expect(unstructured.SetNestedSlice(o.Object, subjects, "subjects")).To(Succeed())
		}
		o.SetResourceVersion("")
		g.Expect(host.Create(ctx, o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
		if o.GetNamespace() == "" {
			t.Cleanup(func() { _ = host.Delete(context.Background(), o) })
		}
	}
	g.Expect(found).To(BeTrue(), "the components have the Deployment's ServiceAccount %s", serviceAccount)

	clientset, err := kubernetes.NewForConfig(l.Host.Config)
	g.Expect(err).NotTo(HaveOccurred())
	token, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return readableDir(t, map[string][]byte{
		"token": []byte(token.Status.Token), "ca.crt": l.Host.CA.CertPEM(), "namespace": []byte(ns),
	})
}

// createAdmittingPolicy creates a GuestIngressPolicy that admits GuestIngresses of ns with
// the IP ip announced on eth0, removed at the end.
func createAdmittingPolicy(t *testing.T, l *lab.Lab, ns, ip string) {
	t.Helper()
	p := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			Addresses:         []string{ip + "/32"},
			L2Announcement:    &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
		},
	}
	if err := l.Host.Client.Create(testContext(t), p); err != nil {
		t.Fatalf("creating GuestIngressPolicy: %v", err)
	}
	t.Cleanup(func() { _ = l.Host.Client.Delete(context.Background(), p) })
}

// readableDir writes files into a new directory that the image's non-root user can read
// (the test's temporary directories are root's alone).
func readableDir(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mount")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// securityContextFlags are podman's flags for the container's securityContext, as the
// kubelet applies it with runc.
func securityContextFlags(t *testing.T, sc *corev1.SecurityContext) []string {
	t.Helper()
	var flags []string
	if ptr.Deref(sc.ReadOnlyRootFilesystem, false) {
		// No tmpfs on /tmp either: a Pod's read-only root filesystem has none.
		flags = append(flags, "--read-only", "--read-only-tmpfs=false")
	} else {
		t.Error("the Deployment's container does not have a read-only root filesystem")
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		flags = append(flags, "--security-opt=no-new-privileges")
	}
	if sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Drop {
			flags = append(flags, "--cap-drop="+string(c))
		}
	}
	if sc.RunAsUser != nil || sc.RunAsGroup != nil {
		// Not passed on: the container runs as the image's user, which the test checks is the
		// Deployment's (so runAsNonRoot holds without them too).
		t.Logf("runAsUser/runAsGroup %d:%d left to the image", ptr.Deref(sc.RunAsUser, -1), ptr.Deref(sc.RunAsGroup, -1))
	}
	return flags
}

// checkContainerProcess reads the container's main process from /proc: the image's non-root
// user, no capabilities, a read-only root filesystem with nothing writable mounted on it but
// the kubelet-style token directory (read-only too), and the lab's network namespace, whose
// interfaces are lo and the lab's own host pod network (Lab.NetworkInterfaces: a bridge and
// veths into namespaces the lab made), so no packet it sends can leave the machine.
func checkContainerProcess(t *testing.T, l *lab.Lab, pid int) {
	t.Helper()
	g := NewWithT(t)
	proc := func(name string) string {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, name))
		g.Expect(err).NotTo(HaveOccurred())
		return string(data)
	}
	status := proc("status")
	g.Expect(status).To(MatchRegexp(`(?m)^Uid:\s+65532\s+65532\s+65532\s+65532$`))
	g.Expect(status).To(MatchRegexp(`(?m)^Gid:\s+65532\s+65532\s+65532\s+65532$`))
	g.Expect(status).To(MatchRegexp(`(?m)^CapEff:\s+0+$`))
	g.Expect(status).To(MatchRegexp(`(?m)^NoNewPrivs:\s+1$`))

	sc := bufio.NewScanner(strings.NewReader(proc("mountinfo")))
	var rootOptions string
	var mounts []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		mountPoint, options := fields[4], strings.Split(fields[5], ",")
		mounts = append(mounts, mountPoint)
		if mountPoint == "/" {
			rootOptions = fields[5]
		}
		if mountPoint == "/tmp" {
			t.Errorf("something is mounted on /tmp (%s): a Pod's read-only root filesystem has no /tmp", sc.Text())
		}
		if mountPoint == "/var/run/secrets/kubernetes.io/serviceaccount" {
			g.Expect(options).To(ContainElement("ro"), "the token mount is read-only")
		}
	}
	g.Expect(strings.Split(rootOptions, ",")).To(ContainElement("ro"), "the root filesystem is read-only; mounts: %v", mounts)

	self, err := os.Readlink("/proc/self/ns/net")
	g.Expect(err).NotTo(HaveOccurred())
	ctr, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ctr).To(Equal(self), "the container shares the lab's network namespace")
	ok, why := lab.InPrivateNetwork()
	g.Expect(ok).To(BeTrue(), why)
	var ifaces []string
	for _, line := range strings.Split(proc("net/dev"), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			ifaces = append(ifaces, name)
		}
	}
	g.Expect(ifaces).To(ConsistOf(l.NetworkInterfaces()), "the container's network interfaces: lo and the lab's host pod network (kernel datapath) only")
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	if n, err := strconv.ParseInt(name, 10, 32); err == nil {
		return int32(n)
	}
	t.Fatalf("the container has no port %s", name)
	return 0
}

func httpGetOK(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s %s", url, resp.Status, body)
	}
	return nil
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// podman runs Debian's podman with runc (`make` installs both), with the flags that work on
// these machines (hybrid cgroups: runc and cgroupfs; ulimits within the hard limits) and a
// storage, configuration and signature policy of the test's own, removed at the end, so
// that nothing of the machine's is used or changed.
type podman struct {
	t      *testing.T
	bin    string
	global []string
	env    []string
	policy string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed: `make test` installs it (hack/ensure-host-tools.sh)", tool)
			}
			t.Skipf("%s is not installed: run `make test`, which installs it (hack/ensure-host-tools.sh)", tool)
		}
	}
	bin, _ := exec.LookPath("podman")
	// Not t.TempDir(): podman refuses a runroot longer than 50 characters.
	dir, err := os.MkdirTemp("", "gn-podman-")
	if err != nil {
		t.Fatal(err)
	}
	p := &podman{t: t, bin: bin, policy: filepath.Join(dir, "policy.json")}
	root, runRoot := filepath.Join(dir, "root"), filepath.Join(dir, "run")
	files := map[string]string{
		"policy.json":     `{"default": [{"type": "insecureAcceptAnything"}]}`,
		"registries.conf": "unqualified-search-registries = []\n",
		"storage.conf":    fmt.Sprintf("[storage]\ndriver = %q\ngraphroot = %q\nrunroot = %q\n", "vfs", root, runRoot),
		"containers.conf": "[engine]\nevents_logger = \"file\"\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.env = append(os.Environ(),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_REGISTRIES_CONF="+filepath.Join(dir, "registries.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
	)
	p.global = []string{
		"--root=" + root, "--runroot=" + runRoot,
		"--tmpdir=" + filepath.Join(dir, "tmp"), "--storage-driver=vfs",
		"--runtime=runc", "--cgroup-manager=cgroupfs", "--events-backend=file",
	}
	t.Cleanup(func() {
		if out, err := p.run(context.Background(), "system", "reset", "--force"); err != nil {
			t.Errorf("podman system reset: %v\n%s", err, out)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing podman's storage: %v", err)
		}
	})
	return p
}

// run runs podman and returns its standard output; the error carries its standard error.
func (p *podman) run(ctx context.Context, args ...string) (string, error) {
	out, _, err := p.exec(ctx, args...)
	return out, err
}

// runExit runs podman and returns its standard output and exit status (for `podman run`,
// the container's).
func (p *podman) runExit(ctx context.Context, args ...string) (string, int) {
	p.t.Helper()
	out, code, err := p.exec(ctx, args...)
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		p.t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return out, code
}

func (p *podman) mustRun(ctx context.Context, args ...string) string {
	p.t.Helper()
	out, err := p.run(ctx, args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (p *podman) exec(ctx context.Context, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, p.bin, slices.Concat(p.global, args)...)
	cmd.Env = p.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), cmd.ProcessState.ExitCode(), err
}

// The node agent is the released image too (`manager node-agent`), run as its DaemonSet's pod
// runs it: under podman and runc, root with every capability dropped but NET_ADMIN, no new
// privileges, a read-only root filesystem, on the host network (here the lab's namespace).
// With --remove it reads the kernel's addresses and nftables tables (which needs NET_ADMIN),
// finds nothing of its own to take off, and answers its readiness probe.
func TestImage_RunsTheNodeAgentUnderPodman(t *testing.T) {
	g := NewWithT(t)
	a := requireImageArtifacts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	pm := newPodman(t)
	id := strings.TrimSpace(pm.mustRun(ctx, "pull", "--quiet", "--signature-policy", pm.policy, "oci-archive:"+a.archive+":"+a.tag))
	pm.mustRun(ctx, "tag", id, a.releaseImage)

	ds := nodeagent.DaemonSet(nodeagent.Params{Image: a.releaseImage, APIServerHost: lab.GuestAPIServerAddress, APIServerPort: lab.APIServerPort})
	raw, err := json.Marshal(ds.Spec.Template.Spec)
	g.Expect(err).NotTo(HaveOccurred())
	spec := &corev1.PodSpec{}
	g.Expect(json.Unmarshal(raw, spec)).To(Succeed())
	g.Expect(spec.HostNetwork).To(BeTrue())
	container := spec.Containers[0]
	g.Expect(container.Image).To(Equal(a.releaseImage))
	g.Expect(container.Command).To(BeEmpty(), "the image's entrypoint, the manager")
	sc := container.SecurityContext
	g.Expect(sc.Capabilities.Add).To(Equal([]corev1.Capability{"NET_ADMIN"}))

	// A free port of the lab namespace for its probe (the DaemonSet's own, 9441, may be taken).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()

	name := "node-agent-" + utilrand.String(5)
	runArgs := []string{"run", "--detach", "--name", name, "--pull=never", "--log-driver=k8s-file", "--network=host",
		"--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096",
		"--user=" + strconv.Itoa(int(ptr.Deref(sc.RunAsUser, -1))), "--cap-add=NET_ADMIN"}
	runArgs = append(runArgs, securityContextFlags(t, sc)...)
	args := append(append([]string{}, container.Args...), "--remove", "--node-name=lab-node", fmt.Sprintf("--health-port=%d", port))
	pm.mustRun(ctx, append(append(runArgs, a.releaseImage), args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := pm.run(context.Background(), "logs", "--tail=40", name)
			t.Logf("node agent container log:\n%s", out)
		}
		_, _ = pm.run(context.Background(), "rm", "--force", "--time=0", name)
	})
	g.Eventually(func() error { return httpGetOK(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", port)) }).
		WithTimeout(time.Minute).WithPolling(500*time.Millisecond).Should(Succeed(), "the agent's readiness probe")

	// Its process holds NET_ADMIN (bit 12) and nothing else.
	pid := strings.TrimSpace(pm.mustRun(ctx, "inspect", "--format={{.State.Pid}}", name))
	status, err := os.ReadFile("/proc/" + pid + "/status")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(status)).To(MatchRegexp(`(?m)^CapEff:\s+0000000000001000$`))
	g.Expect(string(status)).To(MatchRegexp(`(?m)^NoNewPrivs:\s+1$`))

	pm.mustRun(ctx, "stop", "--time=30", name)
	g.Expect(strings.TrimSpace(pm.mustRun(ctx, "inspect", "--format={{.State.ExitCode}}", name))).To(Equal("0"))
}
