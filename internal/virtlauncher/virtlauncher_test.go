package virtlauncher

import (
	"testing"

	. "github.com/onsi/gomega"
)

func TestWorkerSelector(t *testing.T) {
	g := NewWithT(t)
	// Exactly the labels CAPI/CAPK and KubeVirt guarantee on a worker's virt-launcher pod:
	// nothing from virtualMachineTemplate.metadata.labels, nothing that differs per machine,
	// and the namespace of the KubevirtMachines, which another namespace's VMs cannot carry.
	g.Expect(WorkerSelector("k0smotron", "tenant-a")).To(Equal(map[string]string{
		"cluster.x-k8s.io/cluster-name":                    "tenant-a",
		"cluster.x-k8s.io/role":                            "worker",
		"kubevirt.io":                                      "virt-launcher",
		"capk.cluster.x-k8s.io/kubevirt-machine-namespace": "k0smotron",
	}))
}

func TestFormatSelector(t *testing.T) {
	g := NewWithT(t)
	g.Expect(FormatSelector(WorkerSelector("k0smotron", "tenant-a"))).To(Equal(
		"capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher"))
	g.Expect(FormatSelector(nil)).To(BeEmpty())
}
