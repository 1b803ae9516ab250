package e2e

import (
	"context"
	"errors"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// The real CAPK (lab.StartCAPK) provisions the real CAPI's KubevirtMachines through the
// KubeVirt stand-in: it creates a VirtualMachine per KubevirtMachine with its own labels,
// the stand-in boots it (VMI, virt-launcher pod labelled as virt-controller labels it, the
// kernel datapath with KubeVirt's NAT rules for the VM's declared ports, the guest Node),
// CAPK patches the Node's providerID, CAPI finds the Node, and the MachineDeployment becomes
// available. Scaling down deletes a VM, and its VMI, pod and datapath go with it, and CAPI
// deletes its Node. CAPK's webhook refuses a change to a KubevirtMachineTemplate's spec. The
// labels AddWorker gives played workers are the ones the real CAPK and the stand-in give.
func TestLab_RealCAPKCreatesTheVMs(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	ns := uniqueName("capk")
	filter := ns

	capi, err := l.StartCAPI(ctx, ns, filter)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capi.Stop)
	capk, err := l.StartCAPK(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capk.Stop)
	gc, err := l.CreateGuestCluster(ctx, ns, "tenant", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, 30080}},
		lab.ForRealCAPI(filter), lab.ForRealCAPK())
	g.Expect(err).NotTo(HaveOccurred())
	kv, err := l.StartKubeVirtStandIn(ctx, ns, lab.KubeVirtOptions{
		WorkerSubnet: "10.244.120.0/24", KernelDatapath: true,
		OnBoot: func(_ context.Context, w *lab.Worker) error { return w.ServeMachineName(30080) },
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	host, guest := l.Host.Client, l.Guest.Client

	// Both workers become available: VMs booted, Nodes found by CAPI through the providerID
	// CAPK put on them.
	md := &clusterv1.MachineDeployment{}
	g.Eventually(func(g Gomega) {
		g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.MachineDeployment}, md)).To(Succeed())
		g.Expect(ptr.Deref(md.Status.AvailableReplicas, 0)).To(BeEquivalentTo(2))
	}).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(kv.Workers()).To(HaveLen(2))

	vms := &kubevirtv1.VirtualMachineList{}
	g.Expect(host.List(ctx, vms, client.InNamespace(ns))).To(Succeed())
	g.Expect(vms.Items).To(HaveLen(2))
	for _, vm := range vms.Items {
		// CAPK's labels on the VM and its VMI template; the template's VM labels on the VM only.
		g.Expect(vm.Labels).To(HaveKeyWithValue(lab.VMTemplateLabel, gc.WorkerTemplate))
		g.Expect(vm.Labels).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, gc.Name))
		g.Expect(vm.Spec.Template.ObjectMeta.Labels).To(HaveKeyWithValue("cluster.x-k8s.io/role", "worker"))
		g.Expect(vm.Spec.Template.ObjectMeta.Labels).NotTo(HaveKey(lab.VMTemplateLabel))

		vmi := &kubevirtv1.VirtualMachineInstance{}
		g.Expect(host.Get(ctx, client.ObjectKeyFromObject(&vm), vmi)).To(Succeed())
		pods := &corev1.PodList{}
		g.Expect(host.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io/created-by": string(vmi.UID)})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
		pod := pods.Items[0]
		g.Expect(pod.Labels).To(HaveKeyWithValue("kubevirt.io", "virt-launcher"))
		g.Expect(pod.Labels).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, gc.Name))
		g.Expect(pod.Labels).To(HaveKeyWithValue("vm.kubevirt.io/name", vm.Name))
		g.Expect(pod.Labels).NotTo(HaveKey(lab.VMTemplateLabel), "KubeVirt copies the VMI's labels, never the VM's")

		node := &corev1.Node{}
		g.Expect(guest.Get(ctx, client.ObjectKey{Name: vm.Name}, node)).To(Succeed())
		g.Expect(node.Spec.ProviderID).To(Equal("kubevirt://"+vm.Name), "CAPK patches the providerID onto the Node")
	}
	// The kernel datapath forwards exactly what the real VM's interface declares: the VM
	// answers on a declared port, the virt-launcher pod refuses an undeclared one.
	w := kv.Workers()[0]
	g.Expect(w.OnKernelDatapath()).To(BeTrue())
	g.Expect(w.Declared).To(ConsistOf(int32(22), int32(10250), int32(30080)))
	g.Expect(lab.Get(ctx, w.IP, 30080)).To(Equal(w.Machine))
	g.Expect(w.ServeMachineName(30081)).To(Succeed())
	_, err = lab.Get(ctx, w.IP, 30081)
	g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeTrue(), "an undeclared port is refused: %v", err)
	running := map[string]string{}
	for _, w := range kv.Workers() {
		running[w.Machine] = w.IP
	}

	// A played worker (AddWorker) is labelled as the real CAPK and the stand-in label theirs.
	played, err := l.AddWorker(ctx, gc, "played-0", "10.244.120.250", lab.OnKernelDatapath())
	g.Expect(err).NotTo(HaveOccurred())
	realPod, playedPod := &corev1.Pod{}, &corev1.Pod{}
	g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.Pod}, realPod)).To(Succeed())
	g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: played.Pod}, playedPod)).To(Succeed())
	g.Expect(labelShape(playedPod.Labels, played.Machine)).To(Equal(labelShape(realPod.Labels, w.Machine)))
	g.Expect(l.RemoveWorker(ctx, gc, played)).To(Succeed())

	// CAPK's webhook refuses a spec change of a KubevirtMachineTemplate.
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.WorkerTemplate}, tmpl)).To(Succeed())
	g.Expect(unstructured.SetNestedField(tmpl.Object, int64(4), "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "cpu", "cores")).To(Succeed())
	err = host.Update(ctx, tmpl)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "CAPK's webhook refuses it: %v", err)
	g.Expect(err.Error()).To(ContainSubstring("KubevirtMachineTemplateSpec is immutable"))

	// Scaling down: CAPI deletes a Machine, CAPK its VM; the VMI, the pod and the Node go.
	g.Expect(update(ctx, host, md, func() *clusterv1.MachineDeployment { return &clusterv1.MachineDeployment{} }, func(md *clusterv1.MachineDeployment) {
		md.Spec.Replicas = ptr.To[int32](1)
	})).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(host.List(ctx, vms, client.InNamespace(ns))).To(Succeed())
		g.Expect(vms.Items).To(HaveLen(1))
		vmis := &kubevirtv1.VirtualMachineInstanceList{}
		g.Expect(host.List(ctx, vmis, client.InNamespace(ns))).To(Succeed())
		g.Expect(vmis.Items).To(HaveLen(1))
		pods := &corev1.PodList{}
		g.Expect(host.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
		nodes := &corev1.NodeList{}
		g.Expect(guest.List(ctx, nodes)).To(Succeed())
		var names []string
		for _, n := range nodes.Items {
			if strings.HasPrefix(n.Spec.ProviderID, "kubevirt://"+gc.MachineDeployment) {
				names = append(names, n.Name)
			}
		}
		g.Expect(names).To(ConsistOf(vms.Items[0].Name))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(kv.Workers()).To(HaveLen(1))
	delete(running, kv.Workers()[0].Machine)
	for machine, ip := range running {
		_, err := lab.Get(ctx, ip, 30080)
		g.Expect(err).To(HaveOccurred(), "the deleted VM %s answers nothing at %s", machine, ip)
	}

	// A template whose virtualMachineTemplate.metadata.namespace names another namespace:
	// CAPK creates the VMs there, out of reach of host Services in the Cluster's namespace
	// (guestnet's PortsDeclared says WorkersElsewhere).
	vmsNS := ns + "-vms"
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmsNS}})).To(Succeed())
	elsewhere := &unstructured.Unstructured{Object: map[string]any{"spec": tmpl.Object["spec"]}}
	elsewhere.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	elsewhere.SetNamespace(ns)
	elsewhere.SetName(gc.WorkerTemplate + "-elsewhere")
	g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.WorkerTemplate}, tmpl)).To(Succeed())
	elsewhere.Object["spec"] = tmpl.Object["spec"]
	g.Expect(unstructured.SetNestedField(elsewhere.Object, vmsNS, "spec", "template", "spec", "virtualMachineTemplate", "metadata", "namespace")).To(Succeed())
	g.Expect(host.Create(ctx, elsewhere)).To(Succeed())
	// (The real MachineDeployment controller writes it too: retried on conflicts.)
	g.Expect(update(ctx, host, md, func() *clusterv1.MachineDeployment { return &clusterv1.MachineDeployment{} }, func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.InfrastructureRef.Name = elsewhere.GetName()
	})).To(Succeed())
	g.Eventually(func(g Gomega) {
		elsewhereVMs := &kubevirtv1.VirtualMachineList{}
		g.Expect(host.List(ctx, elsewhereVMs, client.InNamespace(vmsNS))).To(Succeed())
		g.Expect(elsewhereVMs.Items).To(HaveLen(1))
		g.Expect(elsewhereVMs.Items[0].Labels).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, gc.Name))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
}

// labelShape is a pod's labels with the machine's name and the VMI's UID as placeholders.
func labelShape(labels map[string]string, machine string) map[string]string {
	out := maps.Clone(labels)
	for k, v := range out {
		switch {
		case k == "kubevirt.io/created-by":
			out[k] = "<uid>"
		case v == machine:
			out[k] = "<machine>"
		}
	}
	return out
}
