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
	// CRDDir holds capi/, capk/ and cilium/ subdirectories of CRD YAML.
	CRDDir string
}

// LookupAssets finds the lab assets named by the environment.
func LookupAssets() (*Assets, error) {
	dirs := filepath.SplitList(os.Getenv("GUESTNET_LAB_BIN"))
	find := func(name string) (string, error) {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
		return "", fmt.Errorf("lab binary %s not found in GUESTNET_LAB_BIN=%q (run `make lab-assets`)", name, strings.Join(dirs, ":"))
	}
	a := &Assets{CRDDir: os.Getenv("GUESTNET_LAB_CRDS")}
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

// Kubectl returns a kubectl command for the given kubeconfig.
func (a *Assets) KubectlCommand(kubeconfig string, args ...string) *exec.Cmd {
	return exec.Command(a.Kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}
