package guestingress

import (
	"context"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

func TestReconcileDeleteReleasesTheObject(t *testing.T) {
	g := NewWithT(t)
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{
		DeletionTimestamp: &metav1.Time{Time: time.Now()},
		Finalizers:        []string{guestnetv1.GuestIngressFinalizer, "someone.else/finalizer"},
	}}

	// No Cluster: nothing to give back in the guest, and no host object exists.
	r := newFakeReconciler(t)
	_, err := r.reconcileDelete(context.Background(), &scope{guestIngress: gi})

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gi.Finalizers).To(Equal([]string{"someone.else/finalizer"}))
}

// newFakeReconciler is a Reconciler on a fake host client that knows Cilium's kinds, with
// no guest cluster connected.
func newFakeReconciler(t *testing.T, objs ...client.Object) *Reconciler {
	t.Helper()
	scheme, mapper := testSchemeAndMapper()
	b := fake.NewClientBuilder().WithScheme(scheme).WithRESTMapper(mapper).WithObjects(objs...)
	for _, i := range slices.Concat(hostIndexes(), ciliumIndexes(), announcerIndexes(ingress.AnnouncerKinds().List())) {
		b = b.WithIndex(i.obj, i.field, i.extract)
	}
	c := b.Build()
	return &Reconciler{
		Client:       c,
		APIReader:    c,
		ClusterCache: clustercache.NewFakeEmptyClusterCache(),
		Admit:        policy.Admit,
		// The host's own addresses: a host with none (HostAddresses is made by SetupWithManager).
		HostAddresses: hostaddrs.Fixed(hostaddrs.Set{}),
		recorder:      events.NewFakeRecorder(100),
	}
}

// testSchemeAndMapper are the host's kinds as the unit tests know them: Kubernetes', CAPI's,
// guestnet's, and Cilium's pool and L2 policy (cluster-scoped).
func testSchemeAndMapper() (*runtime.Scheme, meta.RESTMapper) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(clusterv1.AddToScheme(scheme))
	utilruntime.Must(guestnetv1.AddToScheme(scheme))
	mapper := meta.NewDefaultRESTMapper(nil)
	for _, gvk := range []schema.GroupVersionKind{ingress.PoolGVK, ingress.L2PolicyGVK} {
		mapper.Add(gvk, meta.RESTScopeRoot)
	}
	for gvk := range scheme.AllKnownTypes() {
		mapper.Add(gvk, meta.RESTScopeNamespace)
	}
	return scheme, mapper
}

// While the guest apiserver cannot be reached, nothing is written: the host objects stay as
// they are (requests keep flowing to the workers), and ClusterAvailable says why. The
// ClusterCache's connect event brings the object back; it retries the connection itself.
func TestReconcileNormalChangesNothingWhileTheGuestIsUnreachable(t *testing.T) {
	g := NewWithT(t)
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "web", UID: "uid-1"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  "tenant-a",
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", Labels: map[string]string{"changed": "spec"}},
		},
		Status: guestnetv1.GuestIngressStatus{LoadBalancerIP: "10.2.6.220", HostService: "tenant-a-web", ReadyEndpoints: 2},
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a"}}
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	hostSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Namespace: "k0smotron", Name: "tenant-a-web", Labels: map[string]string{"app.kubernetes.io/managed-by": "guestnet"},
		OwnerReferences: []metav1.OwnerReference{{Kind: "GuestIngress", Name: "web", UID: "uid-1", Controller: ptr.To(true)}},
	}, Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.2.6.220"}}}}}
	kubeconfig := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a-kubeconfig"}}
	r := newFakeReconciler(t, hostSvc, kubeconfig, cluster.DeepCopy(), gi.DeepCopy())
	// Admitted, so that only the unreachable guest can keep things as they are.
	r.Admit = func(policy.Input) policy.Decision { return policy.Decision{Admitted: true, Policy: "all"} }
	writes := recordWrites(r)

	s := &scope{guestIngress: gi, cluster: cluster}
	_, err := r.reconcileNormal(context.Background(), s)
	updateStatus(s)

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(*writes).To(BeEmpty())
	g.Expect(conditions.GetReason(gi, guestnetv1.ClusterAvailableCondition)).To(Equal(guestnetv1.GuestUnreachableReason))
	g.Expect(gi.Status.LoadBalancerIP).To(Equal("10.2.6.220"), "the host Service, as it is, is in status")
	g.Expect(conditions.GetReason(gi, guestnetv1.GuestServiceReadyCondition)).To(Equal(guestnetv1.GuestUnreachableReason))
	g.Expect(conditions.GetReason(gi, guestnetv1.ReadyCondition)).To(Equal(guestnetv1.GuestUnreachableReason))

	// A deletion waits for the guest too: guestnet gives the guest Service back before it
	// lets the object go.
	gi.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	gi.Finalizers = []string{guestnetv1.GuestIngressFinalizer}
	s = &scope{guestIngress: gi, cluster: cluster}
	_, err = r.reconcileDelete(context.Background(), s)
	updateStatus(s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gi.Finalizers).To(ConsistOf(guestnetv1.GuestIngressFinalizer))
	g.Expect(*writes).To(ConsistOf("delete tenant-a-web"), "the host objects go at once")
	g.Expect(conditions.Get(gi, guestnetv1.ReadyCondition).Message).To(ContainSubstring(guestnetv1.SkipGuestCleanupAnnotation))
	g.Expect(gi.Status.LoadBalancerIP).To(BeEmpty())

	// An admin gives up on the guest: the finalizer goes, and an event says what was left.
	gi.Annotations = map[string]string{guestnetv1.SkipGuestCleanupAnnotation: "true"}
	_, err = r.reconcileDelete(context.Background(), &scope{guestIngress: gi, cluster: cluster})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gi.Finalizers).To(BeEmpty())
	g.Expect(<-r.recorder.(*events.FakeRecorder).Events).To(ContainSubstring("Deleted Service k0smotron/tenant-a-web"))
	g.Expect(<-r.recorder.(*events.FakeRecorder).Events).To(And(ContainSubstring("Warning GuestGone"), ContainSubstring("Service projectcontour/envoy in the guest may keep")))
}

// recordWrites makes r's host client note every write it makes (a status patch with its body).
func recordWrites(r *Reconciler) *[]string {
	writes := &[]string{}
	r.Client = interceptor.NewClient(r.Client.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			*writes = append(*writes, "create "+obj.GetName())
			return c.Create(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			*writes = append(*writes, "delete "+obj.GetName())
			return c.Delete(ctx, obj, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			*writes = append(*writes, "apply")
			return c.Apply(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			*writes = append(*writes, "patch "+obj.GetName())
			return c.Patch(ctx, obj, patch, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			data, _ := patch.Data(obj)
			*writes = append(*writes, "patch "+sub+" "+obj.GetName()+" "+string(data))
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	return writes
}

// notTriedCache is a ClusterCache that has not tried to connect to any guest yet: the manager
// has just started.
type notTriedCache struct{ clustercache.ClusterCache }

func (notTriedCache) Tried(context.Context, client.ObjectKey) bool { return false }

// A manager that has just started has not tried to connect to the guest yet. Its reconcile
// writes nothing, status included: what the last manager reported stands until the first try
// (its connect event brings the GuestIngress back). A restart of guestnet is no outage of its
// tenants' guests, and costs no write per GuestIngress.
func TestReconcileBeforeTheFirstConnectWritesNothing(t *testing.T) {
	g := NewWithT(t)
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "web", UID: "uid-1", Generation: 2, Finalizers: []string{guestnetv1.GuestIngressFinalizer}},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  "tenant-a",
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
		},
		Status: guestnetv1.GuestIngressStatus{LoadBalancerIP: "10.2.6.220", HostService: "tenant-a-web", ReadyEndpoints: 2, ObservedGeneration: 1},
	}
	for _, c := range []string{guestnetv1.ClusterAvailableCondition, guestnetv1.GuestServiceReadyCondition, guestnetv1.ReadyCondition} {
		conditions.Set(gi, metav1.Condition{Type: c, Status: metav1.ConditionTrue, Reason: "AsBefore", LastTransitionTime: metav1.Now()})
	}
	conditions.Set(gi, metav1.Condition{Type: guestnetv1.PausedCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.NotPausedReason, LastTransitionTime: metav1.Now()})
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a"}}
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	r := newFakeReconciler(t, cluster, gi.DeepCopy())
	r.ClusterCache = notTriedCache{ClusterCache: clustercache.NewFakeEmptyClusterCache()}
	r.Admit = func(policy.Input) policy.Decision { return policy.Decision{Admitted: true, Policy: "all"} }
	writes := recordWrites(r)

	_, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(gi)})

	g.Expect(*writes).To(BeEmpty())
	g.Expect(err).NotTo(HaveOccurred())
	got := &guestnetv1.GuestIngress{}
	g.Expect(r.Client.Get(context.Background(), client.ObjectKeyFromObject(gi), got)).To(Succeed())
	g.Expect(got.Status.Conditions).To(Equal(gi.Status.Conditions))
	g.Expect(r.recorder.(*events.FakeRecorder).Events).To(BeEmpty())
}
