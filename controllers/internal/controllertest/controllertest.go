// Package controllertest holds the lab tests that GuestIngress and GuestWebhookBridge share:
// the behaviour every guestnet controller has, whatever it exposes (ClusterAvailable through
// CAPI's ClusterCache, CAPI pause, the finalizer, condition events, observedGeneration and
// the printer columns). They run against the lab's real host and guest apiservers, with
// guestnet's manager wiring (internal/manager) started by lab.StartManager.
//
// Each controller package's test binary calls Main from TestMain (one lab per binary) and
// Run from a test with the Kind it reconciles. Every subtest works in a namespace of its own
// with a manager of its own limited to that namespace, so the subtests run in parallel.
package controllertest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega" //nolint:revive,staticcheck // the Gomega DSL, as in the tests this helper serves
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

// Object is a guestnet object: a GuestIngress or a GuestWebhookBridge.
type Object = clusterscope.Object

// Kind describes one guestnet kind and its controller to the shared tests.
type Kind struct {
	// Name is the API kind, e.g. GuestIngress; ShortName its kubectl short name, e.g. gi.
	Name      string
	ShortName string
	// Finalizer is the finalizer the controller puts on every object.
	Finalizer string
	// Columns is the header `kubectl get <ShortName>` prints.
	Columns []string
	// Empty returns an empty object of the kind, to read into.
	Empty func() Object
	// New returns a valid object called name in namespace ns naming Cluster cluster.
	New func(ns, name, cluster string) Object
	// ChangeSpec changes obj's spec, so that its generation moves on once it is written.
	ChangeSpec func(obj Object)
	// Setup registers the controller under test, as main.go does.
	Setup lab.SetupFunc
	// DerivedWhilePaused are the conditions the controller derives even while paused (a
	// GuestIngress's Admitted: a revocation must show, and is acted on, while paused). The
	// pause tests expect them to be reported, and leave them out of "nothing changed".
	DerivedWhilePaused []string
}

// Timing. timeout bounds every wait for the controller: far below ManagerSyncPeriod, so a
// reaction within it comes from a watch, never from a resync.
const (
	timeout  = 30 * time.Second
	interval = 100 * time.Millisecond
)

// --- one lab per test binary ----------------------------------------------------------------

var shared = lab.Shared{DirPrefix: "guestnet-controllers"}

// Main runs the tests of a test binary and then stops its lab (lab.Shared.Main). Call it
// from TestMain.
func Main(m *testing.M) { shared.Main(m) }

// Lab returns the test binary's lab, starting it on first use (lab.Shared.Get).
func Lab(t testing.TB) *lab.Lab { return shared.Get(t) }

// --- the shared tests -------------------------------------------------------------------------

// Run runs the shared tests for kind, each as a parallel subtest.
func Run(t *testing.T, kind Kind) {
	Lab(t) // start it before the subtests, so that their durations do not include it
	tests := []struct {
		name string
		run  func(*env)
	}{
		{"ClusterNotFoundUntilTheClusterIsCreated", testClusterNotFoundUntilCreated},
		{"ClusterNotProvisioned", testClusterNotProvisioned},
		{"KubeconfigRefusedUntilCorrected", testKubeconfigRefused},
		{"FinalizerAddedAndRemovedOnDeletion", testFinalizer},
		{"PausedByClusterSpec", func(e *env) { testPausedByCluster(e, pauseClusterSpec) }},
		{"PausedByClusterAnnotation", func(e *env) { testPausedByCluster(e, pauseClusterAnnotation) }},
		{"PausedByObjectAnnotation", testPausedByObjectAnnotation},
		{"CreatedWhilePausedIsLeftAlone", testCreatedWhilePaused},
		{"DeletionWaitsForTheEndOfThePause", testDeletionWhilePaused},
		{"EventsOnConditionChanges", testEvents},
		{"ObservedGenerationFollowsGeneration", testObservedGeneration},
		{"KubectlGetPrinterColumns", testPrinterColumns},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(newEnv(t, kind))
		})
	}
}

// A GuestIngress or bridge naming a Cluster that does not exist says so, and says what to do;
// once the Cluster is created (provisioned, with its kubeconfig Secret), CAPI's ClusterCache
// connects to the real guest apiserver and ClusterAvailable turns True without any resync.
// Deleting the Cluster brings ClusterNotFound back.
func testClusterNotFoundUntilCreated(e *env) {
	obj := e.create("tenant-a")
	got := e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
	e.g.Expect(got.Message).To(And(
		ContainSubstring(`No Cluster "tenant-a" exists in namespace %q`, e.ns),
		ContainSubstring("create it"),
		ContainSubstring("spec.clusterName"),
	))
	e.expectNotReady(obj)

	gc, err := e.lab.CreateGuestCluster(e.ctx, e.ns, "tenant-a", lab.WorkerTemplateOptions{})
	e.g.Expect(err).NotTo(HaveOccurred())
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionTrue, guestnetv1.ClusterAvailableReason)
	// The other conditions Ready summarises are not reported yet: Ready must not claim more.
	e.expectNotReady(obj)

	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: gc.Name}}
	e.g.Expect(e.c.Delete(e.ctx, cluster)).To(Succeed())
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
}

// A Cluster whose infrastructure is not provisioned has no apiserver yet: ClusterNotProvisioned.
// When it becomes provisioned without a kubeconfig Secret, the guest cannot be reached and
// the condition names the Secret; once the Secret exists, the ClusterCache connects.
func testClusterNotProvisioned(e *env) {
	cluster := e.createCluster("tenant-a", func(*clusterv1.Cluster) {})
	obj := e.create(cluster.Name)
	got := e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotProvisionedReason)
	e.g.Expect(got.Message).To(ContainSubstring("status.initialization.infrastructureProvisioned"))
	e.expectNotReady(obj)

	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
			return err
		}
		cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
		return e.c.Status().Update(e.ctx, cluster)
	})).To(Succeed())
	got = e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.GuestUnreachableReason)
	e.g.Expect(got.Message).To(ContainSubstring("Secret tenant-a-kubeconfig"))

	// The Secret as CAPI control plane providers write it (the label is what lets the
	// manager's cache, and so the ClusterCache, see it).
	e.g.Expect(e.c.Create(e.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: e.ns, Name: "tenant-a-kubeconfig",
			Labels: map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": e.lab.Guest.Kubeconfig},
	})).To(Succeed())
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionTrue, guestnetv1.ClusterAvailableReason)
}

// A <cluster>-kubeconfig Secret whose kubeconfig runs a command and names a file is refused
// before anything runs or is read: ClusterAvailable says KubeconfigRefused and names both
// fields. Once the Secret is corrected, the ClusterCache's next try (every 30 s in
// production, lab.ManagerConnectionRetryInterval here) connects and the refusal clears.
func testKubeconfigRefused(e *env) {
	hostile, err := clientcmd.Load(e.lab.Guest.Kubeconfig)
	e.g.Expect(err).NotTo(HaveOccurred())
	for _, u := range hostile.AuthInfos {
		u.ClientCertificateData, u.ClientKeyData, u.TokenFile = nil, nil, "/var/run/secrets/kubernetes.io/serviceaccount/token"
		u.Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/false", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
	}
	value, err := clientcmd.Write(*hostile)
	e.g.Expect(err).NotTo(HaveOccurred())
	gc, err := e.lab.CreateGuestCluster(e.ctx, e.ns, "tenant-a", lab.WorkerTemplateOptions{}, lab.WithKubeconfig(e.c, value))
	e.g.Expect(err).NotTo(HaveOccurred())
	obj := e.create(gc.Name)
	got := e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.KubeconfigRefusedReason)
	e.g.Expect(got.Message).To(And(
		ContainSubstring("Secret %s/tenant-a-kubeconfig", e.ns),
		ContainSubstring("guest-admin].exec runs a command"),
		ContainSubstring("guest-admin].tokenFile names a file"),
		ContainSubstring("client-certificate-data and client-key-data, or token"),
	))
	e.expectNotReady(obj)

	secret := &corev1.Secret{}
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a-kubeconfig"}, secret)).To(Succeed())
	secret.Data["value"] = e.lab.Guest.Kubeconfig
	e.g.Expect(e.c.Update(e.ctx, secret)).To(Succeed())
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionTrue, guestnetv1.ClusterAvailableReason)
}

// The finalizer is stored on the first reconcile, before anything else is done; deleting the
// object removes it and the object goes away.
func testFinalizer(e *env) {
	obj := e.create("tenant-a")
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.get(g, obj).GetFinalizers()).To(ConsistOf(e.kind.Finalizer))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	e.g.Expect(e.c.Delete(e.ctx, obj)).To(Succeed())
	e.eventuallyGone(obj)
}

// pauseSource is one way CAPI pauses a guestnet object through its Cluster.
type pauseSource struct {
	// reason is the fragment of the Paused message that names this source.
	reason string
	set    func(cluster *clusterv1.Cluster, paused bool)
}

var (
	pauseClusterSpec = pauseSource{
		reason: "has spec.paused set to true",
		set:    func(c *clusterv1.Cluster, paused bool) { c.Spec.Paused = ptr.To(paused) },
	}
	pauseClusterAnnotation = pauseSource{
		reason: "Cluster tenant-a has the " + clusterv1.PausedAnnotation + " annotation",
		set: func(c *clusterv1.Cluster, paused bool) {
			if !paused {
				delete(c.Annotations, clusterv1.PausedAnnotation)
				return
			}
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[clusterv1.PausedAnnotation] = ""
		},
	}
	// objectPausedReason is the fragment of the Paused message for the object's own annotation.
	objectPausedReason = "This object has the " + clusterv1.PausedAnnotation + " annotation"
)

// While its Cluster is paused (spec.paused or the paused annotation), the object reports
// Paused=True and nothing else changes: not the other conditions, not observedGeneration,
// even when its spec changes. Lifting the pause resumes reconciliation.
func testPausedByCluster(e *env, source pauseSource) {
	gc, err := e.lab.CreateGuestCluster(e.ctx, e.ns, "tenant-a", lab.WorkerTemplateOptions{})
	e.g.Expect(err).NotTo(HaveOccurred())
	obj := e.create(gc.Name)
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionTrue, guestnetv1.ClusterAvailableReason)
	before := e.eventuallyObserved(obj)

	e.updateCluster(gc.Name, func(c *clusterv1.Cluster) { source.set(c, true) })
	paused := e.eventuallyCondition(obj, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
	e.g.Expect(paused.Message).To(ContainSubstring(source.reason))
	e.expectUnchangedBut(obj, before)

	// Change the spec while paused. The paused annotation, added to the object in the same
	// write, shows up in the Paused message: proof that the controller saw the new generation.
	e.update(obj, func(o Object) {
		e.kind.ChangeSpec(o)
		o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: ""})
	})
	e.eventuallyPausedMessage(obj, ContainSubstring(objectPausedReason))
	changed := e.expectUnchangedBut(obj, before)
	e.g.Expect(changed.GetGeneration()).To(BeNumerically(">", before.GetGeneration()))

	e.update(obj, func(o Object) { o.SetAnnotations(nil) })
	e.eventuallyPausedMessage(obj, And(ContainSubstring(source.reason), Not(ContainSubstring(objectPausedReason))))
	e.expectUnchangedBut(obj, before) // still paused by the Cluster

	e.updateCluster(gc.Name, func(c *clusterv1.Cluster) { source.set(c, false) })
	e.eventuallyCondition(obj, guestnetv1.PausedCondition, metav1.ConditionFalse, guestnetv1.NotPausedReason)
	e.eventuallyObserved(obj)
}

// The object's own paused annotation pauses it the same way (clusterctl move sets it).
func testPausedByObjectAnnotation(e *env) {
	obj := e.create("tenant-a")
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
	before := e.eventuallyObserved(obj)

	// Pause and change the spec in one write: the reconcile that reports the pause is the
	// one that sees the new generation.
	e.update(obj, func(o Object) {
		e.kind.ChangeSpec(o)
		o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: "true"})
	})
	paused := e.eventuallyCondition(obj, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
	e.g.Expect(paused.Message).To(ContainSubstring(objectPausedReason))
	e.expectUnchangedBut(obj, before)

	e.update(obj, func(o Object) { o.SetAnnotations(nil) })
	e.eventuallyCondition(obj, guestnetv1.PausedCondition, metav1.ConditionFalse, guestnetv1.NotPausedReason)
	e.eventuallyObserved(obj)
}

// An object created while its Cluster is paused gets Paused=True and nothing else: no
// finalizer, no other condition, no observedGeneration. Unpausing the Cluster resumes.
func testCreatedWhilePaused(e *env) {
	cluster := e.createCluster("tenant-a", func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) })
	obj := e.create(cluster.Name)
	e.eventuallyCondition(obj, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
	got := e.get(e.g, obj)
	e.g.Expect(got.GetFinalizers()).To(BeEmpty())
	e.g.Eventually(func(g Gomega) []string { return conditionTypes(e.get(g, obj)) }).WithTimeout(timeout).WithPolling(interval).
		Should(ConsistOf(append([]string{guestnetv1.PausedCondition}, e.kind.DerivedWhilePaused...)))
	e.g.Expect(observedGeneration(e.g, got)).To(BeZero())

	e.updateCluster(cluster.Name, func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(false) })
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotProvisionedReason)
	e.g.Expect(e.get(e.g, obj).GetFinalizers()).To(ConsistOf(e.kind.Finalizer))
	e.eventuallyObserved(obj)
}

// A paused object that is deleted keeps its finalizer (guestnet undoes nothing while
// paused) and goes away once the pause is lifted.
func testDeletionWhilePaused(e *env) {
	cluster := e.createCluster("tenant-a", func(*clusterv1.Cluster) {})
	obj := e.create(cluster.Name)
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.get(g, obj).GetFinalizers()).To(ConsistOf(e.kind.Finalizer))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	e.updateCluster(cluster.Name, func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) })
	e.eventuallyCondition(obj, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
	e.g.Expect(e.c.Delete(e.ctx, obj)).To(Succeed())
	// The annotation added after the deletion shows up in the Paused message: proof that the
	// controller reconciled the object since it was deleted, and left the finalizer.
	e.update(obj, func(o Object) { o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: ""}) })
	e.eventuallyPausedMessage(obj, ContainSubstring(objectPausedReason))
	got := e.get(e.g, obj)
	e.g.Expect(got.GetDeletionTimestamp()).NotTo(BeNil())
	e.g.Expect(got.GetFinalizers()).To(ConsistOf(e.kind.Finalizer))

	e.update(obj, func(o Object) { o.SetAnnotations(nil) })
	e.updateCluster(cluster.Name, func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(false) })
	e.eventuallyGone(obj)
}

// Condition changes are recorded as events.k8s.io/v1 Events on the object: problems the user
// may have to act on as Warning, a deliberate pause as Normal.
func testEvents(e *env) {
	obj := e.create("tenant-a")
	e.eventuallyCondition(obj, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
	uid := e.get(e.g, obj).GetUID()

	e.eventuallyEvent(uid, corev1.EventTypeWarning, guestnetv1.ClusterNotFoundReason,
		fmt.Sprintf(`ClusterAvailable is False: No Cluster "tenant-a" exists in namespace %q`, e.ns))
	// Ready names the condition that is False: its reason is that condition's.
	e.eventuallyEvent(uid, corev1.EventTypeWarning, guestnetv1.ClusterNotFoundReason, "Ready is False")

	e.update(obj, func(o Object) { o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: ""}) })
	e.eventuallyEvent(uid, corev1.EventTypeNormal, guestnetv1.PausedReason, "Paused is True: "+objectPausedReason)
}

// status.observedGeneration follows metadata.generation.
func testObservedGeneration(e *env) {
	obj := e.create("tenant-a")
	first := e.eventuallyObserved(obj)
	e.g.Expect(first.GetGeneration()).To(BeEquivalentTo(1))

	e.update(obj, e.kind.ChangeSpec)
	second := e.eventuallyObserved(obj)
	e.g.Expect(second.GetGeneration()).To(BeEquivalentTo(2))
}

// `kubectl get gi` / `kubectl get gwb` print the kind's columns, with the Cluster and the
// Ready status in them.
func testPrinterColumns(e *env) {
	obj := e.create("tenant-a")
	e.eventuallyCondition(obj, guestnetv1.ReadyCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)

	cmd := e.lab.Assets.KubectlCommand(e.lab.Host.KubeconfigPath, "get", e.kind.ShortName, "-n", e.ns)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	e.g.Expect(err).NotTo(HaveOccurred(), "kubectl get %s: %s", e.kind.ShortName, stderr.String())
	header, rows := parseTable(string(out))
	e.g.Expect(header).To(Equal(e.kind.Columns), "kubectl get %s output:\n%s", e.kind.ShortName, out)
	e.g.Expect(rows).To(HaveLen(1), "kubectl get %s output:\n%s", e.kind.ShortName, out)
	e.g.Expect(rows[0]).To(HaveKeyWithValue("NAME", obj.GetName()))
	e.g.Expect(rows[0]).To(HaveKeyWithValue("CLUSTER", "tenant-a"))
	e.g.Expect(rows[0]).To(HaveKeyWithValue("READY", "False"))
}

// --- the environment of one test ---------------------------------------------------------------

// env is one test's namespace in the shared lab, with a manager of its own running the
// controller under test for that namespace only.
type env struct {
	t    *testing.T
	g    *WithT
	ctx  context.Context
	lab  *lab.Lab
	c    client.Client // the host, uncached
	mgr  ctrl.Manager
	ns   string
	kind Kind
}

func newEnv(t *testing.T, kind Kind) *env {
	l := Lab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	e := &env{
		t: t, g: NewWithT(t), ctx: ctx, lab: l, c: l.Host.Client, kind: kind,
		ns: kind.ShortName + "-" + utilrand.String(6),
	}
	e.g.Expect(e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}})).To(Succeed())
	e.mgr = lab.StartManager(t, l, manager.Options{WatchNamespace: e.ns}, kind.Setup)
	return e
}

// create creates an object of the kind in the test's namespace, naming Cluster cluster.
func (e *env) create(cluster string) Object {
	e.t.Helper()
	obj := e.kind.New(e.ns, strings.ToLower(e.kind.Name)+"-"+utilrand.String(4), cluster)
	e.g.Expect(e.c.Create(e.ctx, obj)).To(Succeed())
	return obj
}

// get reads obj's current state from the apiserver into a new object.
func (e *env) get(g Gomega, obj Object) Object {
	got := e.kind.Empty()
	g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	return got
}

// update applies mutate to obj's current state and writes it, retrying on conflicts (the
// controller writes the status concurrently).
func (e *env) update(obj Object, mutate func(Object)) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := e.kind.Empty()
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			return err
		}
		mutate(got)
		return e.c.Update(e.ctx, got)
	})).To(Succeed())
}

// createCluster creates a CAPI Cluster as the Cluster controller first sees it: not
// provisioned, no kubeconfig Secret. mutate adjusts it before it is created. It returns once
// the manager's cache holds the Cluster, so that an object created next is reconciled
// against it (and not against a cache that has not seen it yet).
func (e *env) createCluster(name string, mutate func(*clusterv1.Cluster)) *clusterv1.Cluster {
	e.t.Helper()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		// Like lab.CreateGuestCluster's: no provider runs, the referenced objects need not
		// exist, and the control plane endpoint is the lab guest's apiserver.
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: lab.GuestControlPlaneEndpoint(),
			ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane", Name: name},
			InfrastructureRef:    clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtCluster", Name: name},
		},
	}
	mutate(cluster)
	e.g.Expect(e.c.Create(e.ctx, cluster)).To(Succeed())
	e.g.Eventually(func() error {
		return e.mgr.GetClient().Get(e.ctx, client.ObjectKeyFromObject(cluster), &clusterv1.Cluster{})
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed(), "the manager's cache never saw Cluster %s", name)
	return cluster
}

// updateCluster applies mutate to the Cluster's current state and writes it.
func (e *env) updateCluster(name string, mutate func(*clusterv1.Cluster)) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cluster := &clusterv1.Cluster{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, cluster); err != nil {
			return err
		}
		mutate(cluster)
		return e.c.Update(e.ctx, cluster)
	})).To(Succeed())
}

// eventuallyCondition waits until obj has the condition with that status and reason, and
// returns it.
func (e *env) eventuallyCondition(obj Object, condType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	e.t.Helper()
	var got *metav1.Condition
	e.g.Eventually(func(g Gomega) {
		got = conditions.Get(e.get(g, obj), condType)
		g.Expect(got).NotTo(BeNil(), "condition %s not reported", condType)
		g.Expect(*got).To(haveStatusAndReason(status, reason), "condition %s", condType)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return got
}

// eventuallyPausedMessage waits until obj is paused with a message that matches message.
func (e *env) eventuallyPausedMessage(obj Object, message OmegaMatcher) {
	e.t.Helper()
	e.g.Eventually(func(g Gomega) {
		paused := conditions.Get(e.get(g, obj), guestnetv1.PausedCondition)
		g.Expect(paused).NotTo(BeNil())
		g.Expect(paused.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(paused.Message).To(message)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// eventuallyObserved waits until status.observedGeneration is the object's generation, and
// returns the object.
func (e *env) eventuallyObserved(obj Object) Object {
	e.t.Helper()
	var got Object
	e.g.Eventually(func(g Gomega) {
		got = e.get(g, obj)
		g.Expect(observedGeneration(g, got)).To(Equal(got.GetGeneration()))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return got
}

// expectUnchangedBut checks that since before, only the Paused condition (and the object's
// metadata and spec) changed: same observedGeneration, finalizers and other conditions. It
// returns the current object.
func (e *env) expectUnchangedBut(obj Object, before Object) Object {
	e.t.Helper()
	now := e.get(e.g, obj)
	e.g.Expect(observedGeneration(e.g, now)).To(Equal(observedGeneration(e.g, before)), "observedGeneration moved while paused")
	e.g.Expect(now.GetFinalizers()).To(Equal(before.GetFinalizers()))
	skip := append([]string{guestnetv1.PausedCondition}, e.kind.DerivedWhilePaused...)
	e.g.Expect(conditionsBut(now, skip...)).To(Equal(conditionsBut(before, skip...)),
		"conditions other than Paused (and those derived while paused) changed while paused")
	return now
}

// expectNotReady checks that Ready is reported and not True.
func (e *env) expectNotReady(obj Object) {
	e.t.Helper()
	ready := conditions.Get(e.get(e.g, obj), guestnetv1.ReadyCondition)
	e.g.Expect(ready).NotTo(BeNil(), "Ready not reported")
	e.g.Expect(ready.Status).NotTo(Equal(metav1.ConditionTrue))
}

// eventuallyGone waits until obj no longer exists.
func (e *env) eventuallyGone(obj Object) {
	e.t.Helper()
	e.g.Eventually(func() bool {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), e.kind.Empty())
		return apierrors.IsNotFound(err)
	}).WithTimeout(timeout).WithPolling(interval).Should(BeTrue(), "%s %s still exists", e.kind.Name, obj.GetName())
}

// eventuallyEvent waits for an events.k8s.io/v1 Event about the object with that UID, of
// that type and reason, whose note starts with notePrefix.
func (e *env) eventuallyEvent(uid types.UID, eventType, reason, notePrefix string) {
	e.t.Helper()
	e.g.Eventually(func(g Gomega) []eventsv1.Event {
		list := &eventsv1.EventList{}
		g.Expect(e.c.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
		var matching []eventsv1.Event
		for _, ev := range list.Items {
			if ev.Regarding.UID == uid && ev.Regarding.Kind == e.kind.Name &&
				ev.Type == eventType && ev.Reason == reason && strings.HasPrefix(ev.Note, notePrefix) {
				matching = append(matching, ev)
			}
		}
		return matching
	}).WithTimeout(timeout).WithPolling(interval).ShouldNot(BeEmpty(),
		"no %s event %s %q on %s %s", eventType, reason, notePrefix, e.kind.Name, e.ns)
}

// --- small helpers -------------------------------------------------------------------------------

// haveStatusAndReason matches a metav1.Condition's status and reason.
func haveStatusAndReason(status metav1.ConditionStatus, reason string) OmegaMatcher {
	return And(
		WithTransform(func(c metav1.Condition) metav1.ConditionStatus { return c.Status }, Equal(status)),
		WithTransform(func(c metav1.Condition) string { return c.Reason }, Equal(reason)),
	)
}

// observedGeneration reads status.observedGeneration, which both kinds have.
func observedGeneration(g Gomega, obj Object) int64 {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	g.Expect(err).NotTo(HaveOccurred())
	status, _ := u["status"].(map[string]any)
	gen, _ := status["observedGeneration"].(int64)
	return gen
}

func conditionTypes(obj Object) []string {
	var types []string
	for _, c := range obj.GetConditions() {
		types = append(types, c.Type)
	}
	return types
}

func conditionsBut(obj Object, skip ...string) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range obj.GetConditions() {
		if !slices.Contains(skip, c.Type) {
			out = append(out, c)
		}
	}
	return out
}

// parseTable splits kubectl's table output into its header and one map per row, cutting
// each row at the header's column offsets (cells may be empty).
func parseTable(out string) ([]string, []map[string]string) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 {
		return nil, nil
	}
	header := strings.Fields(lines[0])
	starts := make([]int, len(header))
	from := 0
	for i, h := range header {
		starts[i] = from + strings.Index(lines[0][from:], h)
		from = starts[i] + len(h)
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, h := range header {
			end := len(line)
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			if starts[i] < end {
				row[h] = strings.TrimSpace(line[starts[i]:end])
			} else {
				row[h] = ""
			}
		}
		rows = append(rows, row)
	}
	return header, rows
}
