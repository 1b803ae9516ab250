package workerports_test

// The worker ports controller against the real Cluster API core manager (lab.StartCAPI),
// instead of lab.SetMachineDeploymentStatus: CAPI's own MachineDeployment and MachineSet
// controllers react to guestnet's repointed MachineDeployment, and guestnet reads the status
// they write. No infrastructure provider runs, so Machines are created (with their
// KubevirtMachines cloned from the template) but never provisioned: a rollout starts and
// never finishes, which is what "one rollout at a time" has to cope with.

import (
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// A GuestIngress that needs a NodePort the worker template does not declare makes guestnet
// repoint the MachineDeployment at a new template (named from the base); the real
// MachineDeployment controller
// then creates one new MachineSet for that template (surging one Machine, whose
// KubevirtMachine is cloned from the new template) and keeps the old one, and guestnet
// declares nothing more (the GuestIngress gains a port) while that rollout runs. Once the VMs boot (played CAPK) the rollout
// finishes, and once the old VMs are gone (not merely when CAPI stops reporting a rollout)
// the next port is declared; the template no longer used is deleted.
func TestPortAddedLaterCreatesTheNextTemplateAfterTheRollout(t *testing.T) {
	filter := "capi-" + utilrand.String(6)
	e := newEnvWithOptions(t, func(e *env) {
		capi, err := e.l.StartCAPI(e.ctx, e.ns, filter)
		e.g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(capi.Stop)
	}, lab.WorkerTemplateOptions{Ports: []int32{22}}, []lab.GuestClusterOption{lab.ForRealCAPI(filter)})
	original := e.gc.WorkerTemplate
	// CAPI's defaulting webhook is registered: it put the cluster name into the selector,
	// which the lab's MachineDeployment does not carry.
	e.g.Expect(e.machineDeployment().Spec.Selector.MatchLabels).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, e.gc.Name))

	// CAPI's first rollout: one MachineSet of the user's template with both Machines; they
	// are up to date (current template) though never provisioned.
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{original: 2}))
		md := e.machineDeployment()
		g.Expect(md.Status.ObservedGeneration).To(Equal(md.Generation))
		g.Expect(ptr.Deref(md.Status.UpToDateReplicas, -1)).To(BeEquivalentTo(2))
	}).Should(Succeed())

	lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupWorkerPorts)
	e.createGuestIngress("web", 30080)
	first := e.eventuallyRepointed(original).Spec.Template.Spec.InfrastructureRef.Name
	e.g.Expect(e.analyze(*e.template(first)).Declared).To(ContainElement(ports.TCP(30080)))

	// The real rollout: a new MachineSet for the new template with one Machine (maxSurge 1),
	// the old one keeps both (maxUnavailable 0, and no new Machine ever becomes available).
	e.g.Eventually(e.machineSetTemplates).Should(Equal(map[string]int32{original: 2, first: 1}))
	e.g.Eventually(func(g Gomega) []string { return e.kubevirtMachinesClonedFrom(g) }).
		Should(ConsistOf(original, original, first))

	// One rollout at a time: a second missing port waits while CAPI still rolls out.
	gi := &guestnetv1.GuestIngress{}
	e.g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "web"}, gi)).To(Succeed())
	gi.Spec.Ports = append(gi.Spec.Ports, guestnetv1.IngressPort{Name: "https", Port: 443, NodePort: ptr.To[int32](30081)})
	e.g.Expect(e.l.Host.Client.Update(e.ctx, gi)).To(Succeed())
	e.g.Consistently(func(g Gomega) {
		g.Expect(e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name).To(Equal(first))
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{original: 2, first: 1}))
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())

	// Play CAPK: the VMs boot, CAPI replaces the old workers one by one; CAPK holds each
	// deleted one until its VM is gone, the first at once, the last for good. With the last
	// old worker being deleted, every desired worker is up to date, but CAPI still reports
	// the rollout (RollingOut True) while its VM runs: guestnet waits for it.
	e.g.Eventually(func(g Gomega) {
		_, err := e.l.ProvisionKubevirtMachines(e.ctx, e.ns)
		g.Expect(err).NotTo(HaveOccurred())
		if old := e.kubevirtMachinesClonedFrom(g); len(slices.DeleteFunc(old, func(t string) bool { return t != original })) > 1 {
			_, err := e.l.ReleaseDeletedKubevirtMachines(e.ctx, e.ns)
			g.Expect(err).NotTo(HaveOccurred())
		}
		md := e.machineDeployment()
		g.Expect(md.Status.ObservedGeneration).To(Equal(md.Generation))
		g.Expect(ptr.Deref(md.Status.UpToDateReplicas, 0)).To(BeEquivalentTo(2))
		g.Expect(conditions.IsTrue(md, clusterv1.MachineDeploymentRollingOutCondition)).To(BeTrue())
		g.Expect(e.kubevirtMachinesClonedFrom(g)).To(ContainElement(original), "an old worker is still being deleted")
	}).Should(Succeed())
	e.g.Consistently(func() string { return e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name }).
		WithTimeout(quiet).WithPolling(interval).Should(Equal(first))

	// The old VMs go: only then guestnet declares the second port, in the next template.
	var second string
	e.g.Eventually(func(g Gomega) {
		_, err := e.l.ReleaseDeletedKubevirtMachines(e.ctx, e.ns)
		g.Expect(err).NotTo(HaveOccurred())
		second = e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name
		g.Expect(second).NotTo(Equal(first))
	}).Should(Succeed())
	e.g.Expect(second).To(MatchRegexp(`^` + original + `-[0-9a-f]{10}$`))
	e.g.Expect(e.analyze(*e.template(second)).Declared).To(ContainElements(ports.TCP(30080), ports.TCP(30081)))

	// The second rollout finishes too; the first generated template goes with its MachineSet.
	e.g.Eventually(func(g Gomega) {
		_, err := e.l.ProvisionKubevirtMachines(e.ctx, e.ns)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = e.l.ReleaseDeletedKubevirtMachines(e.ctx, e.ns)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(e.machineSetTemplates(g)).To(Equal(map[string]int32{second: 2}))
		g.Expect(names(e.generatedTemplates())).To(ConsistOf(second))
	}).Should(Succeed())
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
