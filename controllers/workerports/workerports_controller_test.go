package workerports_test

// Lab tests of the worker ports controller with the real CAPI and CAPK CRDs: the host
// apiserver stores MachineDeployments and KubevirtMachineTemplates exactly as CAPI and CAPK
// define them, and the guest apiserver holds the guest Cilium's kube-system/cilium-config.
// The tests that claim something about a rollout (a deleted MachineSet's template, one new
// template and no write after the rollout, the template revision) run it on the real CAPI
// core manager and CAPK, with KubeVirt played (newRunningRealEnv in realcapi_test.go). The
// others (newEnv) start from a settled MachineDeployment played with
// lab.SetMachineDeploymentStatus: they test a decision taken in that state (no ports list, a
// topology-owned MachineDeployment, a missing template), not a rollout, and a real one
// would only add minutes. That a nodePort the template lacks never reaches the VMs until the workers
// roll is shown end to end by e2e's
// TestGuestIngress_UndeclaredNodePortBreaksTheRequestUntilTheWorkersRoll.
//
// Run with: make test TEST_PKGS=./controllers/workerports/... TEST_ARGS='-v'

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestwebhookbridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/internal/controllertest"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/workerports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

func TestMain(m *testing.M) { controllertest.Main(m) }

const (
	timeout  = 30 * time.Second
	interval = 100 * time.Millisecond
	// quiet is how long a test watches for a write that must not happen.
	quiet = 3 * time.Second
	// tunnelPort is the guest Cilium's tunnel port in every test (the field report's).
	tunnelPort = 8473
)

// The bridge every test uses as the consumer of ports: 32700-32701/TCP.
var bridgePorts = []int32{32700, 32701}

// Missing ports create exactly one new template, named <base>-<hash> (the base starts with the
// Cluster's name), that declares them, and
// the MachineDeployment is repointed at it; the user's template is never changed; once the
// real CAPI has rolled the workers onto it, a second reconcile writes nothing.
func TestDeclaresMissingPortsWithOneNewTemplate(t *testing.T) {
	e, _ := newRunningRealEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}}, "10.244.43.0/24")
	// Read once CAPI has rolled the workers out (it owns the template's ownerReferences).
	original := e.template(e.gc.WorkerTemplate)
	e.createBridge("webhooks")

	md := e.eventuallyRepointed(e.gc.WorkerTemplate)
	e.g.Expect(md.Spec.Template.Spec.InfrastructureRef.Name).To(MatchRegexp(`^` + e.gc.WorkerTemplate + `-[0-9a-f]{10}$`))
	generated := e.generatedTemplates()
	e.g.Expect(generated).To(HaveLen(1))
	declared := e.analyze(generated[0])
	e.g.Expect(declared.State).To(Equal(ports.PortsDeclared))
	e.g.Expect(declared.Declared).To(ConsistOf(ports.TCP(22), ports.TCP(10250), ports.UDP(tunnelPort), ports.TCP(32700), ports.TCP(32701)))
	e.g.Expect(generated[0].GetAnnotations()).To(HaveKeyWithValue(guestnetv1.BaseTemplateAnnotation, e.gc.WorkerTemplate))
	e.g.Expect(e.template(e.gc.WorkerTemplate).Object).To(Equal(original.Object), "the user's template is never edited")
	e.eventuallyEvent("WorkerPortsDeclared", "now uses KubevirtMachineTemplate "+generated[0].GetName())

	// CAPI finishes the rollout; wake the controller again (a watched object changes):
	// guestnet writes nothing any more (CAPI still writes the status, so compare what
	// guestnet writes: the spec, hence the generation, and the annotations).
	e.eventuallyRolledOutTo(generated[0].GetName())
	md = e.machineDeployment()
	e.touchBridge("webhooks")
	e.g.Consistently(func(g Gomega) {
		now := e.machineDeployment()
		g.Expect(now.Generation).To(Equal(md.Generation))
		g.Expect(now.Annotations).To(Equal(md.Annotations))
		g.Expect(e.generatedTemplates()).To(HaveLen(1))
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())
}

// A generated template an old MachineSet still references is kept, and deleted when CAPI
// deletes that MachineSet, though the MachineDeployment does not change any more (found with
// the real CAPI: it deletes the old MachineSet after the rollout's last status update). The
// real CAPI keeps the first copy's MachineSet while KubeVirt holds the new VMs.
func TestTemplateOfADeletedMachineSetIsDeleted(t *testing.T) {
	e, kv := newRunningRealEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}}, "10.244.44.0/24")
	e.createBridge("webhooks")
	first := e.eventuallyRepointed(e.gc.WorkerTemplate).Spec.Template.Spec.InfrastructureRef.Name
	e.eventuallyRolledOutTo(first)

	kv.Hold()
	e.createGuestIngress("web", 30080)
	second := e.eventuallyRepointed(first).Spec.Template.Spec.InfrastructureRef.Name
	e.eventuallyEvent("WorkerPortsDeclared", "now uses KubevirtMachineTemplate "+second)
	e.g.Eventually(e.machineSetTemplates).Should(Equal(map[string]int32{first: 2, second: 1}))
	e.g.Consistently(func() []string { return names(e.generatedTemplates()) }).
		WithTimeout(quiet).WithPolling(interval).Should(ConsistOf(first, second), "the old MachineSet still references the first")

	e.g.Expect(kv.Release(e.ctx)).To(Succeed())
	e.eventuallyRolledOutTo(second)
	e.g.Eventually(func() []string { return names(e.generatedTemplates()) }).Should(ConsistOf(second))
}

// A template without a ports list forwards every port: nothing to declare, nothing changes.
func TestTemplateWithoutPortsListIsLeftAlone(t *testing.T) {
	e := newEnv(t, lab.WorkerTemplateOptions{})
	e.createBridge("webhooks")
	e.expectUntouched()
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.AllPortsForwardedReason)
}

// A MachineDeployment of a ClusterClass topology is never edited; the bridge's PortsDeclared
// condition gives the topology variable value that declares every required port.
func TestTopologyOwnedMachineDeploymentIsNeverTouched(t *testing.T) {
	e := newEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}}, func(md *clusterv1.MachineDeployment) {
		md.Labels[clusterv1.ClusterTopologyOwnedLabel] = ""
	})
	e.createBridge("webhooks")
	e.expectUntouched()
	c := e.eventuallyBridgePortsDeclared(metav1.ConditionFalse, guestnetv1.TopologyVariableRequiredReason)
	e.g.Expect(c.Message).To(ContainSubstring(fmt.Sprintf(`set the Cluster topology variable guestnet to {"workerPorts":[{"port":22,"protocol":"TCP"},{"port":%d,"protocol":"UDP"},{"port":10250,"protocol":"TCP"},{"port":32700,"protocol":"TCP"},{"port":32701,"protocol":"TCP"}]}`, tunnelPort)))
}

// A MachineDeployment whose template does not exist gives a condition, never a crash or a
// half-written object.
func TestMissingTemplateGivesAConditionAndNoWrite(t *testing.T) {
	e := newEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}}, func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.InfrastructureRef.Name = "does-not-exist"
	})
	e.createBridge("webhooks")
	c := e.eventuallyBridgePortsDeclared(metav1.ConditionFalse, guestnetv1.WorkerTemplateErrorReason)
	e.g.Expect(c.Message).To(ContainSubstring("KubevirtMachineTemplate does-not-exist (MachineDeployment " + e.gc.MachineDeployment + ") does not exist"))
	e.expectUntouched()
}

// The Cluster's template-revision annotation forces a new template even when no port is
// missing (for changes no value captures), and the bridge reports the rollout, which the
// real CAPI performs (KubeVirt holds the new VMs until the report is seen).
func TestTemplateRevisionForcesANewTemplate(t *testing.T) {
	e, kv := newRunningRealEnv(t, lab.WorkerTemplateOptions{Ports: append([]int32{22, 10250}, bridgePorts...), UDPPorts: []int32{tunnelPort}}, "10.244.45.0/24")
	e.createBridge("webhooks")
	e.expectUntouched()
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)

	kv.Hold()
	e.annotateCluster(guestnetv1.TemplateRevisionAnnotation, "2")
	md := e.eventuallyRepointed(e.gc.WorkerTemplate)
	tmpl := e.template(md.Spec.Template.Spec.InfrastructureRef.Name)
	e.g.Expect(tmpl.GetAnnotations()).To(HaveKeyWithValue(guestnetv1.TemplateRevisionAnnotation, "2"))
	c := e.eventuallyBridgePortsDeclared(metav1.ConditionFalse, guestnetv1.RollingOutReason)
	e.g.Expect(c.Message).To(ContainSubstring("0 of 2 workers run it"))
	e.g.Eventually(e.machineSetTemplates).Should(Equal(map[string]int32{e.gc.WorkerTemplate: 2, tmpl.GetName(): 1}))

	e.g.Expect(kv.Release(e.ctx)).To(Succeed())
	e.eventuallyRolledOutTo(tmpl.GetName())
	e.eventuallyBridgePortsDeclared(metav1.ConditionTrue, guestnetv1.PortsDeclaredReason)
	e.g.Consistently(func() string { return e.machineDeployment().Spec.Template.Spec.InfrastructureRef.Name }).
		WithTimeout(quiet).WithPolling(interval).Should(Equal(tmpl.GetName()), "the same revision gives the same template")
}

// --- environment --------------------------------------------------------------------------

type env struct {
	t   *testing.T
	g   *WithT
	ctx context.Context
	l   *lab.Lab
	ns  string
	gc  *lab.GuestCluster
}

var ciliumConfigOnce sync.Once

// newEnv creates a guest cluster with one worker MachineDeployment (2 replicas, rollout
// settled) using a template with tmpl's ports, and starts a manager with the worker ports and
// GuestWebhookBridge controllers for it.
func newEnv(t *testing.T, tmpl lab.WorkerTemplateOptions, mutateMD ...func(*clusterv1.MachineDeployment)) *env {
	e := newEnvWithoutManager(t, tmpl, mutateMD...)
	lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupWorkerPortsAndBridge)
	return e
}

// newEnvWithoutManager is newEnv for tests that run managers of their own.
func newEnvWithoutManager(t *testing.T, tmpl lab.WorkerTemplateOptions, mutateMD ...func(*clusterv1.MachineDeployment)) *env {
	e := newEnvWith(t, nil, tmpl, mutateMD...)
	e.settleRollout(2)
	return e
}

// newEnvWith creates the guest cluster of newEnvWithoutManager, after start(e) when set (a
// test starts the real CAPI there), and leaves the rollout to whoever plays or runs CAPI.
func newEnvWith(t *testing.T, start func(*env), tmpl lab.WorkerTemplateOptions, mutateMD ...func(*clusterv1.MachineDeployment)) *env {
	return newEnvWithOptions(t, start, tmpl, nil, mutateMD...)
}

func newEnvWithOptions(t *testing.T, start func(*env), tmpl lab.WorkerTemplateOptions, opts []lab.GuestClusterOption, mutateMD ...func(*clusterv1.MachineDeployment)) *env {
	t.Parallel()
	l := controllertest.Lab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, g: NewWithT(t), ctx: ctx, l: l, ns: "wp-" + utilrand.String(6)}
	e.g.SetDefaultEventuallyTimeout(timeout)
	e.g.SetDefaultEventuallyPollingInterval(interval)

	// Every test's cluster points at the lab's one guest: its Cilium tunnels on 8473.
	ciliumConfigOnce.Do(func() {
		e.g.Expect(l.Guest.Client.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cilium-config"},
			Data:       map[string]string{"tunnel-protocol": "vxlan", "tunnel-port": fmt.Sprint(tunnelPort)},
		})).To(Succeed())
	})

	if start != nil {
		start(e)
	}
	var err error
	e.gc, err = l.CreateGuestCluster(ctx, e.ns, "guest-1", tmpl, opts...)
	e.g.Expect(err).NotTo(HaveOccurred())
	if len(mutateMD) > 0 {
		md := e.machineDeployment()
		for _, m := range mutateMD {
			m(md)
		}
		e.g.Expect(l.Host.Client.Update(ctx, md)).To(Succeed())
	}
	return e
}

func (e *env) machineDeployment() *clusterv1.MachineDeployment {
	md := &clusterv1.MachineDeployment{}
	e.g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: e.gc.MachineDeployment}, md)).To(Succeed())
	return md
}

// settleRollout plays CAPI finishing a rollout: every replica runs the current template.
func (e *env) settleRollout(replicas int32) {
	e.g.Expect(e.l.SetMachineDeploymentStatus(e.ctx, e.gc, replicas, replicas)).To(Succeed())
}

func (e *env) template(name string) *unstructured.Unstructured {
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	e.g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, tmpl)).To(Succeed())
	return tmpl
}

func (e *env) generatedTemplates() []unstructured.Unstructured {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtMachineTemplateList"))
	e.g.Expect(e.l.Host.Client.List(e.ctx, list, client.InNamespace(e.ns), client.MatchingLabels{guestnetv1.GeneratedTemplateLabel: e.gc.Name})).To(Succeed())
	return list.Items
}

func (e *env) analyze(tmpl unstructured.Unstructured) ports.Analysis {
	a, err := ports.Analyze(&tmpl, nil)
	e.g.Expect(err).NotTo(HaveOccurred())
	return a
}

// eventuallyRepointed waits until the MachineDeployment no longer points at from.
func (e *env) eventuallyRepointed(from string) *clusterv1.MachineDeployment {
	var md *clusterv1.MachineDeployment
	e.g.Eventually(func() string {
		md = e.machineDeployment()
		return md.Spec.Template.Spec.InfrastructureRef.Name
	}).ShouldNot(Equal(from))
	return md
}

// expectUntouched checks for a while that the MachineDeployment keeps its template and no
// template is generated.
func (e *env) expectUntouched() {
	before := e.machineDeployment()
	e.g.Consistently(func(g Gomega) {
		md := e.machineDeployment()
		g.Expect(md.Spec.Template.Spec.InfrastructureRef.Name).To(Equal(before.Spec.Template.Spec.InfrastructureRef.Name))
		g.Expect(md.Generation).To(Equal(before.Generation))
		g.Expect(e.generatedTemplates()).To(BeEmpty())
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())
}

func (e *env) createBridge(name string) {
	e.g.Expect(e.l.Host.Client.Create(e.ctx, &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:   e.gc.Name,
			APIServices:   &guestnetv1.TargetSelector{Names: []string{"v1beta1.metrics.k8s.io"}},
			NodePortRange: guestnetv1.NodePortRange{Start: bridgePorts[0], Size: int32(len(bridgePorts))},
		},
	})).To(Succeed())
}

func (e *env) touchBridge(name string) {
	gwb := &guestnetv1.GuestWebhookBridge{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test.guestnet.dev/touched":"`+utilrand.String(5)+`"}}}`))
	e.g.Expect(e.l.Host.Client.Patch(e.ctx, gwb, patch)).To(Succeed())
}

// createGuestIngress creates a GuestIngress that needs nodePort (no GuestIngress controller
// runs here: the worker ports controller reads its spec).
func (e *env) createGuestIngress(name string, nodePort int32) {
	e.g.Expect(e.l.Host.Client.Create(e.ctx, &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  e.gc.Name,
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80, NodePort: ptr.To(nodePort)}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
		},
	})).To(Succeed())
}

// annotateCluster sets an annotation on the Cluster, retrying on conflicts (the real CAPI
// writes the Cluster too).
func (e *env) annotateCluster(key, value string) {
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cluster := &clusterv1.Cluster{}
		if err := e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: e.gc.Name}, cluster); err != nil {
			return err
		}
		cluster.Annotations = withEntry(cluster.Annotations, key, value)
		return e.l.Host.Client.Update(e.ctx, cluster)
	})).To(Succeed())
}

func (e *env) eventuallyBridgePortsDeclared(status metav1.ConditionStatus, reason string) *metav1.Condition {
	var c *metav1.Condition
	e.g.Eventually(func(g Gomega) {
		gwb := &guestnetv1.GuestWebhookBridge{}
		g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "webhooks"}, gwb)).To(Succeed())
		c = conditions.Get(gwb, guestnetv1.PortsDeclaredCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(status), c.Message)
		g.Expect(c.Reason).To(Equal(reason), c.Message)
	}).Should(Succeed())
	return c
}

func (e *env) eventuallyEvent(reason, noteContains string) {
	e.g.Eventually(func(g Gomega) {
		events := &eventsv1.EventList{}
		g.Expect(e.l.Host.Client.List(e.ctx, events, client.InNamespace(e.ns))).To(Succeed())
		var notes []string
		for _, ev := range events.Items {
			if ev.Reason == reason && ev.Regarding.Kind == "Cluster" {
				notes = append(notes, ev.Note)
			}
		}
		g.Expect(notes).To(ContainElement(ContainSubstring(noteContains)))
	}).Should(Succeed())
}

func names(items []unstructured.Unstructured) []string {
	out := make([]string, len(items))
	for i := range items {
		out[i] = items[i].GetName()
	}
	return out
}

// setupWorkerPorts registers the worker ports controller on mgr, as main.go does.
func setupWorkerPorts(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
	return (&workerports.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     cc,
		WatchFilterValue: o.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.WorkerPortsConcurrency))
}

// setupWorkerPortsAndBridge registers the worker ports and GuestWebhookBridge controllers on
// mgr, as main.go does (the bridge declares its nodePort range through the worker ports).
func setupWorkerPortsAndBridge(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
	if err := setupWorkerPorts(ctx, mgr, cc, o); err != nil {
		return err
	}
	return (&guestwebhookbridge.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     cc,
		WatchFilterValue: o.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.GuestWebhookBridgeConcurrency))
}
