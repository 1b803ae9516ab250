package workerports_test

// The worker ports controller against the real Cluster API core manager (lab.StartCAPI) and
// the real CAPK (lab.StartCAPK), instead of lab.SetMachineDeploymentStatus: CAPI's own
// MachineDeployment and MachineSet controllers react to guestnet's repointed
// MachineDeployment, CAPK creates a VirtualMachine per KubevirtMachine from its template, and
// guestnet reads the status they write. KubeVirt is played (lab.StartKubeVirtStandIn, its VMs
// on the lab's kernel datapath with KubeVirt's own NAT rules): until it runs, VMs never boot,
// so a rollout starts and never finishes, which is what "one rollout at a time" has to cope
// with.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// A GuestIngress that needs a NodePort the worker template does not declare makes guestnet
// repoint the MachineDeployment at a new template (named from the base); the real
// MachineDeployment controller then creates one new MachineSet for that template (surging
// one Machine, whose KubevirtMachine is cloned from the new template, and whose VM CAPK
// creates with the new port) and keeps the old one, and guestnet declares nothing more (the
// GuestIngress gains a port) while that rollout runs. Once KubeVirt boots the VMs the
// rollout finishes, and once the old Machines are gone (not merely when CAPI stops
// reporting a rollout) the next port is declared; the second rollout leaves only VMs that
// forward both ports, and the template no longer used is deleted.
func TestPortAddedLaterCreatesTheNextTemplateAfterTheRollout(t *testing.T) {
	e := newRealEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
	original := e.gc.WorkerTemplate
	// CAPI's defaulting webhook is registered: it put the cluster name into the selector,
	// which the lab's MachineDeployment does not carry.
	e.g.Expect(e.machineDeployment().Spec.Selector.MatchLabels).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, e.gc.Name))

	// CAPI's first rollout: one MachineSet of the user's template with both Machines; they
	// are up to date (current template) though their VMs never boot (no KubeVirt yet).
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{original: 2}))
		md := e.machineDeployment()
		g.Expect(md.Status.ObservedGeneration).To(Equal(md.Generation))
		g.Expect(ptr.Deref(md.Status.UpToDateReplicas, -1)).To(BeEquivalentTo(2))
		g.Expect(e.vmPorts(g)).To(HaveLen(2), "CAPK created a VM per KubevirtMachine")
	}).Should(Succeed())

	lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupWorkerPorts)
	e.createGuestIngress("web", 30080)
	first := e.eventuallyRepointed(original).Spec.Template.Spec.InfrastructureRef.Name
	e.g.Expect(e.analyze(*e.template(first)).Declared).To(ContainElement(ports.TCP(30080)))

	// The real rollout: a new MachineSet for the new template with one Machine (maxSurge 1),
	// the old one keeps both (maxUnavailable 0, and no new Machine ever becomes available);
	// CAPK creates the new Machine's VM from the new template.
	e.g.Eventually(e.machineSetTemplates).Should(Equal(map[string]int32{original: 2, first: 1}))
	e.g.Eventually(func(g Gomega) []string { return e.kubevirtMachinesClonedFrom(g) }).
		Should(ConsistOf(original, original, first))
	e.g.Eventually(e.vmPorts).Should(ConsistOf("22", "22", "22,8473,10250,30080"))

	// One rollout at a time: a second missing port waits while CAPI still rolls out.
	gi := &guestnetv1.GuestIngress{}
	e.g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "web"}, gi)).To(Succeed())
	gi.Spec.Ports = append(gi.Spec.Ports, guestnetv1.IngressPort{Name: "https", Port: 443, NodePort: ptr.To[int32](30081)})
	e.g.Expect(e.l.Host.Client.Update(e.ctx, gi)).To(Succeed())
	e.g.Consistently(func(g Gomega) {
		g.Expect(e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name).To(Equal(first))
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{original: 2, first: 1}))
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())

	// KubeVirt boots the VMs: CAPK reports them ready and gives their Nodes the providerID,
	// CAPI replaces the old workers one by one. Only once the old Machines are gone does
	// guestnet declare the second port, in the next template.
	kv, err := e.l.StartKubeVirtStandIn(e.ctx, e.ns, lab.KubeVirtOptions{WorkerSubnet: "10.244.40.0/24", KernelDatapath: true})
	e.g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	var second string
	e.g.Eventually(func(g Gomega) {
		second = e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name
		g.Expect(second).NotTo(Equal(first))
	}).WithTimeout(rollout).WithPolling(time.Second).Should(Succeed())
	e.g.Expect(e.kubevirtMachinesClonedFrom(e.g)).NotTo(ContainElement(original), "no old Machine left when the next template is declared")
	e.g.Expect(second).To(MatchRegexp(`^` + original + `-[0-9a-f]{10}$`))
	e.g.Expect(e.analyze(*e.template(second)).Declared).To(ContainElements(ports.TCP(30080), ports.TCP(30081)))

	// The second rollout finishes too: only VMs forwarding both ports run; the first
	// generated template goes with its MachineSet.
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{second: 2}))
		g.Expect(e.vmPorts(g)).To(HaveExactElements(
			And(ContainSubstring(",30080"), ContainSubstring(",30081")), And(ContainSubstring(",30080"), ContainSubstring(",30081"))))
		g.Expect(names(e.generatedTemplates())).To(ConsistOf(second))
		md := e.machineDeployment()
		g.Expect(ptr.Deref(md.Status.AvailableReplicas, 0)).To(BeEquivalentTo(2))
	}).WithTimeout(rollout).WithPolling(time.Second).Should(Succeed())
	for _, w := range kv.Workers() {
		e.g.Expect(w.Declared).To(ContainElements(int32(30080), int32(30081)), "the masquerade stand-in of %s", w.Machine)
	}
}

// A MachineDeployment repointed by someone else (a user, a GitOps change) at a template that
// lacks the ports is followed at once, while CAPI is still rolling it out: waiting for that
// rollout would black-hole the nodePorts on every new worker and then roll them all again.
// guestnet repoints it, in one write, at a copy that declares them, and the real CAPI rolls
// the workers onto the copy; the bridge says
// the ports are not there while that rollout runs (KubeVirt held: the new VMs cannot boot),
// and are once it is over. Whatever CAPI started for the user's template meanwhile is gone:
// every VM left forwards the bridge's ports. (The played variant of this test checked the
// same with lab.SetMachineDeploymentStatus.)
func TestRepointToATemplateLackingThePortsIsFollowedAtOnce(t *testing.T) {
	e := newRealEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
	kv, err := e.l.StartKubeVirtStandIn(e.ctx, e.ns, lab.KubeVirtOptions{WorkerSubnet: "10.244.41.0/24", KernelDatapath: true})
	e.g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	e.g.SetDefaultEventuallyTimeout(rollout)
	e.eventuallyAvailable(2)
	startWorkerPortsAndBridge(t, e)
	e.createBridge("webhooks")
	first := e.eventuallyRepointed(e.gc.WorkerTemplate).Spec.Template.Spec.InfrastructureRef.Name
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)
	e.g.Eventually(e.machineSetTemplates).Should(Equal(map[string]int32{first: 2}))

	// The user's new template: 4 cores, and the ports of their original (SSH only).
	kv.Hold()
	e.copyTemplate(e.gc.WorkerTemplate, "guest-1-md-0-v2", func(u *unstructured.Unstructured) {
		e.g.Expect(unstructured.SetNestedField(u.Object, int64(4), "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "cpu", "cores")).To(Succeed())
	})
	e.repointAs(e.gc, "kubectl-edit", "guest-1-md-0-v2")
	userGeneration := e.machineDeployment().Generation
	md := e.eventuallyRepointed("guest-1-md-0-v2")
	next := md.Spec.Template.Spec.InfrastructureRef.Name
	e.g.Expect(next).To(MatchRegexp(`^guest-1-md-0-v2-[0-9a-f]{10}$`))
	e.g.Expect(md.Generation).To(Equal(userGeneration+1), "one write by guestnet")
	e.g.Expect(e.analyze(*e.template(next)).Declared).To(ContainElements(ports.TCP(32700), ports.TCP(32701), ports.UDP(tunnelPort)))
	e.eventuallyBridgePortsDeclared(metav1.ConditionFalse, guestnetv1.RollingOutReason)

	// KubeVirt boots the new VMs: CAPI finishes the rollout onto the copy.
	e.g.Expect(kv.Release(e.ctx)).To(Succeed())
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{next: 2}))
		g.Expect(e.kubevirtMachinesClonedFrom(g)).To(ConsistOf(next, next))
		g.Expect(e.vmPorts(g)).To(HaveExactElements(
			And(ContainSubstring("32700"), ContainSubstring("32701")), And(ContainSubstring("32700"), ContainSubstring("32701"))))
	}).WithPolling(time.Second).Should(Succeed())
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)
	e.g.Consistently(func() int64 { return e.machineDeployment().Generation }).
		WithTimeout(quiet).WithPolling(interval).Should(Equal(md.Generation))
}

// A MachineDeployment repointed by someone else at a template that already declares the
// ports rolls once, by the real CAPI: guestnet adds no second rollout, not even for the
// Cluster's template revision, which was rolled out already. (The played variant of this
// test checked the same with lab.SetMachineDeploymentStatus.)
func TestRepointToATemplateWithThePortsCausesNoSecondRollout(t *testing.T) {
	e := newRealEnv(t, lab.WorkerTemplateOptions{Ports: append([]int32{22, 10250}, bridgePorts...), UDPPorts: []int32{tunnelPort}})
	kv, err := e.l.StartKubeVirtStandIn(e.ctx, e.ns, lab.KubeVirtOptions{WorkerSubnet: "10.244.42.0/24", KernelDatapath: true})
	e.g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	e.g.SetDefaultEventuallyTimeout(rollout)
	e.eventuallyAvailable(2)
	startWorkerPortsAndBridge(t, e)
	e.createBridge("webhooks")
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cluster := &clusterv1.Cluster{}
		if err := e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: e.gc.Name}, cluster); err != nil {
			return err
		}
		cluster.Annotations = withEntry(cluster.Annotations, guestnetv1.TemplateRevisionAnnotation, "2")
		return e.l.Host.Client.Update(e.ctx, cluster)
	})).To(Succeed())
	revised := e.eventuallyRepointed(e.gc.WorkerTemplate).Spec.Template.Spec.InfrastructureRef.Name
	e.g.Eventually(e.machineSetTemplates).WithPolling(time.Second).Should(Equal(map[string]int32{revised: 2}))
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)

	// The user's new template: 4 cores, and the ports of their original (all of them).
	e.copyTemplate(e.gc.WorkerTemplate, "guest-1-md-0-v2", func(u *unstructured.Unstructured) {
		e.g.Expect(unstructured.SetNestedField(u.Object, int64(4), "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "cpu", "cores")).To(Succeed())
	})
	e.repointAs(e.gc, "kubectl-edit", "guest-1-md-0-v2")
	md := e.machineDeployment()

	// CAPI rolls the workers onto it, once.
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{"guest-1-md-0-v2": 2}))
		g.Expect(e.kubevirtMachinesClonedFrom(g)).To(ConsistOf("guest-1-md-0-v2", "guest-1-md-0-v2"))
		g.Expect(ptr.Deref(e.machineDeployment().Status.AvailableReplicas, 0)).To(BeEquivalentTo(2))
	}).WithPolling(time.Second).Should(Succeed())
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)
	e.g.Consistently(func(g Gomega) {
		now := e.machineDeployment()
		g.Expect(now.Spec.Template.Spec.InfrastructureRef.Name).To(Equal("guest-1-md-0-v2"))
		g.Expect(now.Generation).To(Equal(md.Generation))
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())
}

// rollout bounds a real rollout of two workers: CAPK requeues a VM it created after 20 s.
const rollout = 4 * time.Minute

// newRealEnv is newEnvWithOptions with the real CAPI and CAPK started for the test's
// namespace (no KubeVirt yet: tests start the stand-in when VMs may boot) and a context long
// enough for real rollouts.
func newRealEnv(t *testing.T, tmpl lab.WorkerTemplateOptions) *env {
	filter := "capi-" + utilrand.String(6)
	return newEnvWithOptions(t, func(e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		t.Cleanup(cancel)
		e.ctx = ctx
		capi, err := e.l.StartCAPI(e.ctx, e.ns, filter)
		e.g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(capi.Stop)
		capk, err := e.l.StartCAPK(e.ctx, e.ns)
		e.g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(capk.Stop)
	}, tmpl, []lab.GuestClusterOption{lab.ForRealCAPI(filter), lab.ForRealCAPK()})
}

// newRunningRealEnv is newRealEnv with KubeVirt played on workerSubnet (lab-wide unique per
// test) from the start, the first rollout over (two available workers on the user's
// template), and guestnet's worker ports and GuestWebhookBridge controllers started; every
// Eventually of the test may last a real rollout.
func newRunningRealEnv(t *testing.T, tmpl lab.WorkerTemplateOptions, workerSubnet string) (*env, *lab.KubeVirt) {
	e := newRealEnv(t, tmpl)
	kv, err := e.l.StartKubeVirtStandIn(e.ctx, e.ns, lab.KubeVirtOptions{WorkerSubnet: workerSubnet, KernelDatapath: true})
	e.g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	e.g.SetDefaultEventuallyTimeout(rollout)
	e.eventuallyAvailable(2)
	startWorkerPortsAndBridge(t, e)
	return e, kv
}

// eventuallyRolledOutTo waits until CAPI has rolled the workers onto template: one MachineSet
// left, of that template, and both workers available.
func (e *env) eventuallyRolledOutTo(template string) {
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{template: 2}))
		g.Expect(ptr.Deref(e.machineDeployment().Status.AvailableReplicas, 0)).To(BeEquivalentTo(2))
	}).WithTimeout(rollout).WithPolling(time.Second).Should(Succeed())
}

// startWorkerPortsAndBridge starts guestnet's worker ports and GuestWebhookBridge controllers.
func startWorkerPortsAndBridge(t *testing.T, e *env) {
	lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupWorkerPortsAndBridge)
}

// withEntry returns m (a new map when nil) with key set to value.
func withEntry(m map[string]string, key, value string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[key] = value
	return m
}

// eventuallyAvailable waits until CAPI reports replicas available workers.
func (e *env) eventuallyAvailable(replicas int32) {
	e.g.Eventually(func(g Gomega) {
		md := e.machineDeployment()
		g.Expect(ptr.Deref(md.Status.AvailableReplicas, 0)).To(Equal(replicas))
	}).WithPolling(time.Second).Should(Succeed())
}

// vmPorts lists, for each VirtualMachine CAPK created, the ports its pod interface declares
// (comma-separated, in order).
func (e *env) vmPorts(g Gomega) []string {
	vms := &kubevirtv1.VirtualMachineList{}
	g.Expect(e.l.Host.Client.List(e.ctx, vms, client.InNamespace(e.ns))).To(Succeed())
	var out []string
	for _, vm := range vms.Items {
		var declared []string
		for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
			for _, p := range iface.Ports {
				declared = append(declared, fmt.Sprint(p.Port))
			}
		}
		out = append(out, strings.Join(declared, ","))
	}
	return out
}

// machineSetTemplates maps the infrastructure template of each of the MachineDeployment's
// MachineSets (CAPI's) to its desired replicas.
func (e *env) machineSetTemplates(g Gomega) map[string]int32 {
	list := &clusterv1.MachineSetList{}
	g.Expect(e.l.Host.Client.List(e.ctx, list, client.InNamespace(e.ns),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: e.gc.MachineDeployment})).To(Succeed())
	out := map[string]int32{}
	for _, ms := range list.Items {
		out[ms.Spec.Template.Spec.InfrastructureRef.Name] = ptr.Deref(ms.Spec.Replicas, 0)
	}
	return out
}

// kubevirtMachinesClonedFrom lists, for each KubevirtMachine CAPI created, the template it
// was cloned from.
func (e *env) kubevirtMachinesClonedFrom(g Gomega) []string {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtMachineList"))
	g.Expect(e.l.Host.Client.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
	var out []string
	for _, m := range list.Items {
		out = append(out, m.GetAnnotations()[clusterv1.TemplateClonedFromNameAnnotation])
	}
	return out
}
