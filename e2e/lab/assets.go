package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Assets locates the binaries and third-party CRDs the lab runs with. The Makefile builds and
// fetches them at pinned versions and passes their locations in the environment:
// GUESTNET_LAB_BIN (a PATH-style list of directories) and GUESTNET_LAB_CRDS.
type Assets struct {
	Etcd                  string
	KubeAPIServer         string
	KubeControllerManager string
	Kubectl               string
	// CRDDir holds capi/, capk/, cilium/ and metallb/ subdirectories of CRD YAML.
	CRDDir string

	// binDirs is GUESTNET_LAB_BIN, where LookupThirdParty looks.
	binDirs []string
}

// ThirdPartyAssets are the real third-party servers that run in the lab's guest cluster,
// built by the Makefile from their Go modules at pinned versions (hack/tools/cert-manager,
// hack/tools/metrics-server), each with the manifests of the same release next to it.
type ThirdPartyAssets struct {
	// CertManagerWebhook and CertManagerCAInjector are cert-manager's cmd/webhook and
	// cmd/cainjector; the directory holding them has crds/ (cert-manager's CRDs).
	CertManagerWebhook    string
	CertManagerCAInjector string
	CertManagerCRDDir     string
	// MetricsServer is metrics-server's cmd/metrics-server; MetricsServerManifests is the
	// release's components YAML (kustomize build manifests/overlays/release) next to it.
	MetricsServer          string
	MetricsServerManifests string
}

// LookupAssets finds the lab assets named by the environment.
func LookupAssets() (*Assets, error) {
	dirs := filepath.SplitList(os.Getenv("GUESTNET_LAB_BIN"))
	find := func(name string) (string, error) { return findFile(dirs, name) }
	a := &Assets{CRDDir: os.Getenv("GUESTNET_LAB_CRDS"), binDirs: dirs}
	var err error
	for _, b := range []struct {
		name string
		dst  *string
	}{
		{"etcd", &a.Etcd}, {"kube-apiserver", &a.KubeAPIServer},
		{"kube-controller-manager", &a.KubeControllerManager}, {"kubectl", &a.Kubectl},
	} {
		if *b.dst, err = find(b.name); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(a.CRDDir, ".complete")); err != nil {
		return nil, fmt.Errorf("third-party CRDs not found in GUESTNET_LAB_CRDS=%q (run `make lab-assets`)", a.CRDDir)
	}
	return a, nil
}

// LookupThirdParty finds the third-party servers (and their manifests) in GUESTNET_LAB_BIN.
// Only tests that run them need them, so LookupAssets does not require them.
func (a *Assets) LookupThirdParty() (*ThirdPartyAssets, error) {
	t := &ThirdPartyAssets{}
	var err error
	for _, b := range []struct {
		name string
		dst  *string
	}{
		{"cert-manager-webhook", &t.CertManagerWebhook},
		{"cert-manager-cainjector", &t.CertManagerCAInjector},
		{"metrics-server", &t.MetricsServer},
	} {
		if *b.dst, err = findFile(a.binDirs, b.name); err != nil {
			return nil, err
		}
	}
	t.CertManagerCRDDir = filepath.Join(filepath.Dir(t.CertManagerWebhook), "crds")
	t.MetricsServerManifests = filepath.Join(filepath.Dir(t.MetricsServer), "components.yaml")
	for _, p := range []string{filepath.Join(t.CertManagerCRDDir, "crd-clusterissuers.yaml"), t.MetricsServerManifests} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("third-party manifests missing: %w (run `make lab-assets`)", err)
		}
	}
	return t, nil
}

// ClusterctlAssets are clusterctl, built by the Makefile from Cluster API's cmd/clusterctl at the
// pinned release (hack/tools/clusterctl), and, in the capi/ directory next to it, what the
// tests' local (file://) repositories of the Cluster API providers need from the same release
// (hack/fetch-clusterctl-assets.sh).
type ClusterctlAssets struct {
	Clusterctl string
	// CAPIDir holds the release's metadata.yaml and the CRDs of the providers `clusterctl init`
	// installs by default: core/ (cluster-api), bootstrap-kubeadm/, control-plane-kubeadm/.
	CAPIDir string
}

// LookupClusterctl finds clusterctl and the Cluster API release files next to it.
func (a *Assets) LookupClusterctl() (*ClusterctlAssets, error) {
	bin, err := findFile(a.binDirs, "clusterctl")
	if err != nil {
		return nil, err
	}
	c := &ClusterctlAssets{Clusterctl: bin, CAPIDir: filepath.Join(filepath.Dir(bin), "capi")}
	if _, err := os.Stat(filepath.Join(c.CAPIDir, ".complete")); err != nil {
		return nil, fmt.Errorf("Cluster API release files missing: %w (run `make lab-assets`)", err)
	}
	return c, nil
}

func findFile(dirs []string, name string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("lab binary %s not found in GUESTNET_LAB_BIN=%q (run `make lab-assets`)", name, strings.Join(dirs, ":"))
}

// KubectlCommand returns a kubectl command for the given kubeconfig.
func (a *Assets) KubectlCommand(kubeconfig string, args ...string) *exec.Cmd {
	return exec.Command(a.Kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}
