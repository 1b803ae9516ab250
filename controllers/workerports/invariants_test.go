package workerports_test

// The invariants of the worker templates (docs/worker-ports.md#invariants), each proven
// against the lab's real host apiserver with the real CAPI and CAPK CRDs, in a world that
// does not cooperate: clusters sharing a template, objects guestnet did not write holding
// the names it would use, MachineSets of other clusters, users and GitOps tools repointing
// MachineDeployments behind guestnet's back.
//
// The tests assert on MachineDeployment specs, templates and guestnet's conditions.
// TestRevertByGitOpsIsNotFought, whose claims are about rollouts (rolled back, rolled once
// more), runs them on the real CAPI and CAPK (newRunningRealEnv). The others play a settled
// MachineDeployment (settle): they test decisions taken in that state, with several Clusters
// or a crashing manager, where a real rollout each time would only multiply minutes.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/workerports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/diagnose"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/faultclient"
)

// Two Clusters whose MachineDeployments use the same template, with the same requirements,
// get a copy each, named after their Cluster: no Cluster ever adopts, uses or deletes a copy
// made for another. When one Cluster moves on to its next copy, the other's stays.
func TestSharedTemplateGetsOneCopyPerCluster(t *testing.T) {
	e := newEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
	a := e.gc
	b := e.createCluster("guest-2", func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.InfrastructureRef.Name = a.WorkerTemplate
	})

	e.annotate(a, guestnetv1.ExtraWorkerPortsAnnotation, "32700")
	aCopy := e.repointedFrom(a, a.WorkerTemplate)
	e.annotate(b, guestnetv1.ExtraWorkerPortsAnnotation, "32700")
	bCopy := e.repointedFrom(b, a.WorkerTemplate)

	e.g.Expect(aCopy).To(MatchRegexp(`^guest-1-md-0-[0-9a-f]{10}$`), "the base already starts with the Cluster's name")
	e.g.Expect(bCopy).To(MatchRegexp(`^guest-1-md-0-guest-2-[0-9a-f]{10}$`), "a copy for guest-2 names guest-2")
	e.g.Expect(e.template(aCopy).GetLabels()).To(HaveKeyWithValue(guestnetv1.GeneratedTemplateLabel, a.Name))
	e.g.Expect(e.template(bCopy).GetLabels()).To(HaveKeyWithValue(guestnetv1.GeneratedTemplateLabel, b.Name))
	e.g.Expect(e.analyze(*e.template(aCopy)).Declared).To(Equal(e.analyze(*e.template(bCopy)).Declared), "same content, still two copies")

	// guest-1 needs one more port: its next copy replaces its first, which is deleted once
	// unused; guest-2's copy is untouched.
	e.settle(a, 2)
	e.annotate(a, guestnetv1.ExtraWorkerPortsAnnotation, "32700,32701")
	aNext := e.repointedFrom(a, aCopy)
	e.g.Eventually(func() []string { return names(e.generatedFor(a)) }).Should(ConsistOf(aNext))
	e.g.Consistently(func(g Gomega) {
		g.Expect(e.mdOf(b).Spec.Template.Spec.InfrastructureRef.Name).To(Equal(bCopy))
		g.Expect(e.exists(bCopy)).To(BeTrue(), "guest-2's copy must never be deleted while guest-2 uses it")
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())
}

// A generated template that any MachineDeployment or MachineSet of the namespace references
// is never deleted, whichever Cluster they belong to (here another Cluster's MachineSet, as
// CAPI keeps it during a rollout, and another Cluster's MachineDeployment a user pointed at
// it). What decides is read from the API server. Once nothing references it, it goes.
func TestGeneratedTemplateInUseAnywhereInTheNamespaceIsKept(t *testing.T) {
	e := newEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
	a := e.gc
	e.annotate(a, guestnetv1.ExtraWorkerPortsAnnotation, "32700")
	first := e.repointedFrom(a, a.WorkerTemplate)

	other := e.createCluster("guest-2", func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.InfrastructureRef.Name = first
	})
	ms := e.createMachineSet(other, "guest-2-old", first)

	e.settle(a, 2)
	e.annotate(a, guestnetv1.ExtraWorkerPortsAnnotation, "32700,32701")
	e.repointedFrom(a, first)
	e.g.Consistently(func() bool { return e.exists(first) }).WithTimeout(quiet).WithPolling(interval).
		Should(BeTrue(), "guest-2's MachineDeployment and MachineSet use it")

	// The other Cluster's MachineDeployment moves away: its MachineSet still holds the template.
	e.repointAs(other, "kubectl-edit", other.WorkerTemplate)
	e.annotate(a, "test.guestnet.dev/touched", "1")
	e.g.Consistently(func() bool { return e.exists(first) }).WithTimeout(quiet).WithPolling(interval).
		Should(BeTrue(), "guest-2's MachineSet uses it")

	// Nothing references it any more: the next reconcile deletes it.
	e.g.Expect(e.l.Host.Client.Delete(e.ctx, ms)).To(Succeed())
	e.annotate(a, "test.guestnet.dev/touched", "2")
	e.g.Eventually(func() bool { return e.exists(first) }).Should(BeFalse())
}

// An object guestnet did not write that holds the name of the copy guestnet would create
// (other content, no generated-for label) is never adopted: the MachineDeployment is not
// repointed at it, and PortsDeclared says why and what to do.
func TestObjectHoldingTheCopysNameIsNotAdopted(t *testing.T) {
	e := newEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
	want := e.copyGuestnetWouldWrite(e.gc)

	// Someone else's template with that name: the same ports, 8 cores instead of 2.
	foreign := want.DeepCopy()
	foreign.SetLabels(nil)
	e.g.Expect(unstructured.SetNestedField(foreign.Object, int64(8), "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "cpu", "cores")).To(Succeed())
	e.g.Expect(e.l.Host.Client.Create(e.ctx, foreign)).To(Succeed())

	e.createBridge("webhooks")
	c := e.eventuallyBridgePortsDeclared(metav1.ConditionFalse, guestnetv1.TemplateNameTakenReason)
	e.g.Expect(c.Message).To(ContainSubstring("KubevirtMachineTemplate " + want.GetName() + " already exists"))
	e.g.Consistently(func(g Gomega) {
		g.Expect(e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name).To(Equal(e.gc.WorkerTemplate))
		cores, _, _ := unstructured.NestedInt64(e.template(want.GetName()).Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "cpu", "cores")
		g.Expect(cores).To(BeEquivalentTo(8), "the foreign template is left as it is")
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())

	// The owner renames theirs out of the way: guestnet creates its copy and repoints.
	e.g.Expect(e.l.Host.Client.Delete(e.ctx, foreign)).To(Succeed())
	e.touchBridge("webhooks")
	e.g.Expect(e.eventuallyRepointed(e.gc.WorkerTemplate).Spec.Template.Spec.InfrastructureRef.Name).To(Equal(want.GetName()))
}

// A GitOps tool that re-applies the MachineDeployment from its source sets infrastructureRef
// back to the template without the ports. guestnet does not fight it (every round would roll
// the workers twice, forever): it stops repointing, PortsDeclared names the tool's field
// manager and gives the exact ports list to declare in the source, and so does diagnose.
// Once the source declares them, the condition clears and guestnet writes nothing.
func TestRevertByGitOpsIsNotFought(t *testing.T) {
	for i, tool := range []struct {
		name, manager string
		// serverSide: Flux's kustomize-controller applies with server-side apply, forced;
		// Argo CD's default is a client-side apply (a patch).
		serverSide bool
	}{
		{name: "server-side apply", manager: "kustomize-controller", serverSide: true},
		{name: "client-side apply", manager: "argocd-controller"},
	} {
		t.Run(tool.name, func(t *testing.T) {
			e, _ := newRunningRealEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}}, fmt.Sprintf("10.244.%d.0/24", 46+i))
			revert := func(template string) {
				if tool.serverSide {
					e.applyInfrastructureRefAs(e.gc, tool.manager, template)
				} else {
					e.repointAs(e.gc, tool.manager, template)
				}
			}
			e.createBridge("webhooks")
			first := e.eventuallyRepointed(e.gc.WorkerTemplate).Spec.Template.Spec.InfrastructureRef.Name
			// A second copy replaces the first: the revert is recognised all the same.
			e.eventuallyRolledOutTo(first)
			e.createGuestIngress("web", 30080)
			e.eventuallyRepointed(first)

			revert(e.gc.WorkerTemplate)
			c := e.eventuallyBridgePortsDeclared(metav1.ConditionFalse, guestnetv1.RepointRevertedReason)
			wantList := fmt.Sprintf(`[{"port":22},{"port":%d,"protocol":"UDP"},{"port":10250,"protocol":"TCP"},{"port":30080,"protocol":"TCP"},{"port":32700,"protocol":"TCP"},{"port":32701,"protocol":"TCP"}]`, tunnelPort)
			e.g.Expect(c.Message).To(ContainSubstring("field manager " + tool.manager))
			e.g.Expect(c.Message).To(ContainSubstring(wantList))

			// CAPI rolls back to the reverted template; guestnet leaves it there.
			md := e.machineDeployment()
			e.eventuallyRolledOutTo(e.gc.WorkerTemplate)
			e.g.Consistently(func(g Gomega) {
				now := e.machineDeployment()
				g.Expect(now.Spec.Template.Spec.InfrastructureRef.Name).To(Equal(e.gc.WorkerTemplate))
				g.Expect(now.Generation).To(Equal(md.Generation))
			}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())

			// diagnose prints the list to add to the source.
			state, err := diagnose.Gather(e.ctx, e.l.Host.Client, diagnose.GatherOptions{Namespace: e.ns, Cluster: e.gc.Name})
			e.g.Expect(err).NotTo(HaveOccurred())
			r := e.findResult(diagnose.Diagnose(state), diagnose.CheckPorts, e.gc.MachineDeployment)
			e.g.Expect(r.Verdict).To(Equal(diagnose.Fail))
			e.g.Expect(r.Detail).To(ContainSubstring(tool.manager))
			e.g.Expect(r.Fix).To(ContainSubstring(wantList))

			// The source is fixed: a new template that declares the list, applied by the tool.
			e.copyTemplate(e.gc.WorkerTemplate, "guest-1-md-0-fixed", func(u *unstructured.Unstructured) {
				var list []any
				e.g.Expect(json.Unmarshal([]byte(wantList), &list)).To(Succeed())
				ifaces, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "devices", "interfaces")
				ifaces[0].(map[string]any)["ports"] = list
				e.g.Expect(unstructured.SetNestedSlice(u.Object, ifaces, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "devices", "interfaces")).To(Succeed())
			})
			revert("guest-1-md-0-fixed")
			md = e.machineDeployment()
			e.eventuallyRolledOutTo("guest-1-md-0-fixed")
			e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)
			e.g.Consistently(func() int64 { return e.machineDeployment().Generation }).
				WithTimeout(quiet).WithPolling(interval).Should(Equal(md.Generation))
		})
	}
}

// --- helpers for several Clusters in one test ------------------------------------------------

// createCluster creates another guest cluster in the test's namespace with a worker template
// that declares SSH only, applies mutate to its MachineDeployment and settles its rollout.
func (e *env) createCluster(name string, mutate func(*clusterv1.MachineDeployment)) *lab.GuestCluster {
	gc, err := e.l.CreateGuestCluster(e.ctx, e.ns, name, lab.WorkerTemplateOptions{Ports: []int32{22}})
	e.g.Expect(err).NotTo(HaveOccurred())
	md := e.mdOf(gc)
	mutate(md)
	e.g.Expect(e.l.Host.Client.Update(e.ctx, md)).To(Succeed())
	e.settle(gc, 2)
	return gc
}

func (e *env) mdOf(gc *lab.GuestCluster) *clusterv1.MachineDeployment {
	md := &clusterv1.MachineDeployment{}
	e.g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: gc.Namespace, Name: gc.MachineDeployment}, md)).To(Succeed())
	return md
}

func (e *env) settle(gc *lab.GuestCluster, replicas int32) {
	e.g.Expect(e.l.SetMachineDeploymentStatus(e.ctx, gc, replicas, replicas)).To(Succeed())
}

// repointedFrom waits until gc's MachineDeployment no longer points at from, and returns
// the template it points at.
func (e *env) repointedFrom(gc *lab.GuestCluster, from string) string {
	var now string
	e.g.Eventually(func() string {
		now = e.mdOf(gc).Spec.Template.Spec.InfrastructureRef.Name
		return now
	}).ShouldNot(Equal(from))
	return now
}

func (e *env) annotate(gc *lab.GuestCluster, key, value string) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: gc.Name}}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	e.g.Expect(err).NotTo(HaveOccurred())
	e.g.Expect(e.l.Host.Client.Patch(e.ctx, cluster, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
}

func (e *env) generatedFor(gc *lab.GuestCluster) []unstructured.Unstructured {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtMachineTemplateList"))
	e.g.Expect(e.l.Host.Client.List(e.ctx, list, client.InNamespace(e.ns), client.MatchingLabels{guestnetv1.GeneratedTemplateLabel: gc.Name})).To(Succeed())
	return list.Items
}

func (e *env) exists(template string) bool {
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	err := e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: template}, tmpl)
	if apierrors.IsNotFound(err) {
		return false
	}
	e.g.Expect(err).NotTo(HaveOccurred())
	return true
}

// createMachineSet creates a MachineSet of gc using template, as CAPI keeps the old one
// during a rollout (0 replicas: it creates no Machine once CAPI runs in the lab).
func (e *env) createMachineSet(gc *lab.GuestCluster, name, template string) *clusterv1.MachineSet {
	md := e.mdOf(gc)
	ms := &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: name, Labels: map[string]string{
			clusterv1.ClusterNameLabel: gc.Name, clusterv1.MachineDeploymentNameLabel: gc.MachineDeployment,
		}},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: gc.Name,
			Replicas:    ptr.To[int32](0),
			Selector:    md.Spec.Selector,
			Template:    *md.Spec.Template.DeepCopy(),
		},
	}
	ms.Spec.Template.Spec.InfrastructureRef.Name = template
	e.g.Expect(e.l.Host.Client.Create(e.ctx, ms)).To(Succeed())
	return ms
}

// copyTemplate creates a user's template named to: a copy of from's spec, changed by mutate.
func (e *env) copyTemplate(from, to string, mutate func(*unstructured.Unstructured)) {
	src := e.template(from)
	u := &unstructured.Unstructured{Object: map[string]any{"spec": src.Object["spec"]}}
	u.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	u.SetNamespace(e.ns)
	u.SetName(to)
	mutate(u)
	e.g.Expect(e.l.Host.Client.Create(e.ctx, u)).To(Succeed())
}

// repointAs points gc's MachineDeployment at template with a patch by field manager
// manager, as `kubectl edit`, `kubectl apply` (client-side) or Argo CD do.
func (e *env) repointAs(gc *lab.GuestCluster, manager, template string) {
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: gc.MachineDeployment}}
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"infrastructureRef":{"name":%q}}}}}`, template)
	e.g.Expect(e.l.Host.Client.Patch(e.ctx, md, client.RawPatch(types.MergePatchType, []byte(patch)), client.FieldOwner(manager))).To(Succeed())
}

// applyInfrastructureRefAs server-side applies, forced, gc's MachineDeployment with its
// infrastructureRef naming template, as field manager manager (Flux's kustomize-controller
// applies the whole object this way).
func (e *env) applyInfrastructureRefAs(gc *lab.GuestCluster, manager, template string) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": clusterv1.GroupVersion.String(), "kind": "MachineDeployment",
		"metadata": map[string]any{"namespace": gc.Namespace, "name": gc.MachineDeployment},
		"spec": map[string]any{
			"clusterName": gc.Name,
			"template": map[string]any{"spec": map[string]any{
				"clusterName": gc.Name,
				"infrastructureRef": map[string]any{
					"apiGroup": ports.KubevirtMachineTemplateGVK.Group, "kind": ports.KubevirtMachineTemplateGVK.Kind, "name": template,
				},
			}},
		},
	}}
	e.g.Expect(e.l.Host.Client.Apply(e.ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership)).To(Succeed())
}

// copyGuestnetWouldWrite is the template guestnet writes for gc once the test's bridge
// exists: computed with internal/ports from the real guest's cilium-config.
func (e *env) copyGuestnetWouldWrite(gc *lab.GuestCluster) *unstructured.Unstructured {
	cluster := &clusterv1.Cluster{}
	e.g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: gc.Namespace, Name: gc.Name}, cluster)).To(Succeed())
	bridge := &guestnetv1.GuestWebhookBridge{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "webhooks"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{ClusterName: gc.Name, NodePortRange: guestnetv1.NodePortRange{Start: bridgePorts[0], Size: int32(len(bridgePorts))}}}
	required, _, err := ports.ForCluster(e.ctx, e.l.Guest.Client, cluster, ports.Consumers{Bridges: []*guestnetv1.GuestWebhookBridge{bridge}})
	e.g.Expect(err).NotTo(HaveOccurred())
	tmpl := e.template(gc.WorkerTemplate)
	analysis, err := ports.Analyze(tmpl, required)
	e.g.Expect(err).NotTo(HaveOccurred())
	want, err := ports.Declare(tmpl, analysis.Missing, gc.Name, "")
	e.g.Expect(err).NotTo(HaveOccurred())
	return want
}

func (e *env) findResult(rep *diagnose.Report, check, object string) diagnose.Result {
	e.t.Helper()
	var seen []string
	for _, r := range rep.Results {
		if r.Check == check && r.Object == object {
			return r
		}
		seen = append(seen, r.Check+"/"+r.Object)
	}
	e.t.Fatalf("no %s result for %s among %s", check, object, strings.Join(seen, ", "))
	return diagnose.Result{}
}

// A manager that crashes at any write of a reconcile (creating the next copy, repointing the
// MachineDeployment, deleting the copy no longer used) and restarts converges: the
// MachineDeployment on the copy guestnet would write, that copy adopted if the crashed run
// created it, exactly one generated template left, nothing refused.
func TestCrashAtAnyWriteConverges(t *testing.T) {
	const writes = 3 // create the copy, repoint, delete the previous copy
	for crashAt := 0; crashAt <= writes; crashAt++ {
		t.Run(fmt.Sprintf("crash before write %d", crashAt+1), func(t *testing.T) {
			e := newEnvWithoutManager(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
			e.annotate(e.gc, guestnetv1.ExtraWorkerPortsAnnotation, "32700")
			stop := e.runWorkerPorts(nil)
			first := e.repointedFrom(e.gc, e.gc.WorkerTemplate)
			e.g.Expect(stop()).To(Succeed())
			e.settle(e.gc, 2)

			e.annotate(e.gc, guestnetv1.ExtraWorkerPortsAnnotation, "32700,32701")
			crashed := make(chan struct{})
			budget := faultclient.NewBudget(crashAt, func() { close(crashed) })
			if crashAt == writes {
				budget = faultclient.NewBudget(-1, nil) // the recording run: no crash
			}
			stop = e.runWorkerPorts(budget)
			if crashAt < writes {
				e.g.Eventually(crashed).WithTimeout(timeout).Should(BeClosed())
			} else {
				e.g.Eventually(func() []string { return names(e.generatedFor(e.gc)) }).Should(And(HaveLen(1), Not(ContainElement(first))))
			}
			e.g.Expect(stop()).To(Succeed())
			if crashAt == writes {
				// A reconcile on a cache that has not yet seen the deletion (a MachineSet's
				// deletion wakes the controller too) may delete the copy again: NotFound, no harm.
				e.g.Expect(slices.Compact(slices.Clone(budget.Writes))).To(HaveExactElements(HavePrefix("create KubevirtMachineTemplate"), HavePrefix("patch MachineDeployment"), HavePrefix("delete KubevirtMachineTemplate")))
			}

			stop = e.runWorkerPorts(nil)
			defer func() { e.g.Expect(stop()).To(Succeed()) }()
			next := e.repointedFrom(e.gc, first)
			e.g.Expect(next).To(MatchRegexp(`^guest-1-md-0-[0-9a-f]{10}$`))
			e.g.Expect(e.analyze(*e.template(next)).Declared).To(ContainElements(ports.TCP(32700), ports.TCP(32701)))
			e.g.Eventually(func() []string { return names(e.generatedFor(e.gc)) }).Should(ConsistOf(next))
			e.g.Expect(e.mdOf(e.gc).Annotations).To(HaveKeyWithValue(guestnetv1.RepointedFromAnnotation, e.gc.WorkerTemplate), "the user's template, not the copy replaced")
			e.g.Consistently(func() string { return e.mdOf(e.gc).Spec.Template.Spec.InfrastructureRef.Name }).
				WithTimeout(quiet).WithPolling(interval).Should(Equal(next))
		})
	}
}

// runWorkerPorts runs a manager with the worker ports controller alone, its writes charged to
// budget (nil: no fault), until the returned function stops it.
func (e *env) runWorkerPorts(budget *faultclient.Budget) func() error {
	_, stop, err := lab.RunManager(e.ctx, e.l, manager.Options{WatchNamespace: e.ns}, func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, _ manager.Options) error {
		c := mgr.GetClient()
		if budget != nil {
			c = faultclient.Wrap(c, budget)
		}
		return (&workerports.Reconciler{Client: c, APIReader: mgr.GetAPIReader(), ClusterCache: cc}).
			SetupWithManager(ctx, mgr, controller.Options{})
	}, logr.Discard())
	e.g.Expect(err).NotTo(HaveOccurred())
	return stop
}
