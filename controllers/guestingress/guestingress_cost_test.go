package guestingress

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

// What one GuestIngress reconcile costs on the host, in a fleet at rest, read through a real
// controller-runtime informer cache (the fake client copies every object it lists, which
// would hide what the cache costs). No apiserver: each informer lists the fleet's objects of
// its kind once and then watches nothing.

// The regression guard of issue 21: a reconcile reads the claims near its own, so what it
// allocates does not grow with the fleet. Machine-independent: bytes, not time.
func TestGuestIngressReconcileCostDoesNotGrowWithTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds fleets of 200 and 2,000")
	}
	g := NewWithT(t)
	small, large := bytesPerReconcile(t, 200), bytesPerReconcile(t, 2000)
	t.Logf("bytes allocated per reconcile: %d at N=200, %d at N=2,000", small, large)
	g.Expect(large).To(BeNumerically("<=", small*3/2),
		"a GuestIngress reconcile allocates in proportion to the fleet: it reads more than the claims near its own")
}

// BenchmarkGuestIngressReconcileOnTheHost is one reconcile of a member at rest: reconcileHeld
// then observe (the guest is not provisioned: no guest connection).
func BenchmarkGuestIngressReconcileOnTheHost(b *testing.B) {
	for _, n := range []int{100, 1000, 3000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			r, members := newCachedFleet(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				reconcileOnTheHost(b, r, members[i%len(members)])
			}
		})
	}
}

func bytesPerReconcile(t *testing.T, n int) uint64 {
	r, members := newCachedFleet(t, n)
	const rounds = 100
	for i := range 20 { // warm up: the first reads of each kind
		reconcileOnTheHost(t, r, members[i%len(members)])
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range rounds {
		reconcileOnTheHost(t, r, members[(i*7919)%len(members)])
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / rounds
}

// The harness's fleet is at rest as guestnet leaves it: each member is admitted, in conflict
// with nobody, finds its pool, L2 policy and host Service as its own, and nothing is written
// (newCachedReconciler fails the test on a write or a request to an apiserver).
func TestCachedFleetIsAtRest(t *testing.T) {
	g := NewWithT(t)
	r, members := newCachedFleet(t, 5)
	for _, gi := range members {
		s := reconcileOnTheHost(t, r, gi)
		o := s.observed
		g.Expect(o.HostService).NotTo(BeNil(), "host Service of %s", gi.Namespace)
		g.Expect(o.Pool).NotTo(BeNil(), "pool of %s", gi.Namespace)
		g.Expect(o.L2Policy).NotTo(BeNil(), "L2 policy of %s", gi.Namespace)
		g.Expect(o.Self.Held.IP).To(Equal(ingress.ClaimOf(gi).IP), "the IP %s holds", gi.Namespace)
		g.Expect(o.ForeignPools).To(BeEmpty())
		g.Expect(s.guestClient).To(BeNil(), "a guest connection")
	}
}

// reconcileOnTheHost runs what a reconcile of a member at rest does on the host, and checks
// that it decided what a member at rest is: admitted, no conflict.
func reconcileOnTheHost(tb testing.TB, r *Reconciler, gi *guestnetv1.GuestIngress) *scope {
	ctx := context.Background()
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: gi.Namespace, Name: gi.Spec.ClusterName}, cluster); err != nil {
		tb.Fatal(err)
	}
	s := &scope{guestIngress: gi.DeepCopy(), cluster: cluster}
	if err := r.reconcileHeld(ctx, s); err != nil || s.swept || s.revoked {
		tb.Fatalf("reconcileHeld of %s: %v (swept %t, revoked %t)", gi.Name, err, s.swept, s.revoked)
	}
	if err := r.observe(ctx, s); err != nil {
		tb.Fatalf("observe of %s: %v", gi.Name, err)
	}
	if !s.observed.Admission.Admitted || ingress.Contest(s.observed.Self, s.observed.Claimants) != nil {
		tb.Fatalf("%s/%s is not at rest: admitted %t, %v", gi.Namespace, gi.Name, s.observed.Admission.Admitted, ingress.Contest(s.observed.Self, s.observed.Claimants))
	}
	return s
}

// newCachedFleet is a Reconciler on a cache that holds a fleet of n members at rest, and the
// members' GuestIngresses.
func newCachedFleet(tb testing.TB, n int) (*Reconciler, []*guestnetv1.GuestIngress) {
	objs, members := fleetAtRest(n)
	return newCachedReconciler(tb, managerIndexes, objs...), members
}

// managerIndexes are the field indexes the manager's cache has on a host that serves Cilium's
// LB-IPAM (SetupWithManager, watchCilium).
func managerIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	return addIndexes(ctx, indexer, slices.Concat(hostIndexes(), ciliumIndexes()))
}

// fleetAtRest is a hosting provider's fleet of n guest clusters, each with one GuestIngress
// and what guestnet made for it (pool, L2 policy, host Service with its IP, as the builders of
// internal/ingress make them): a namespace per tenant, IPs from a few shared /24s, every fifth
// member with a /30 pool of its own instead, one policy that admits them all. The Clusters are
// not provisioned: no guest connection is attempted.
func fleetAtRest(n int) ([]client.Object, []*guestnetv1.GuestIngress) {
	objs := []client.Object{&guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "tenants"},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "yes"}},
			Addresses:           []string{"10.2.0.0/16", "10.3.0.0/16"},
			LoadBalancerClasses: []string{guestnetv1.DefaultLoadBalancerClass},
			L2Announcement:      &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
		},
	}}
	admitted := ingress.Admission{Admitted: true, Policy: "tenants", Announcer: ingress.AnnouncerCiliumL2,
		Announcement: ingress.Announcement{Interfaces: []string{"^eth0$"}}}
	var members []*guestnetv1.GuestIngress
	created := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	for i := range n {
		ns := fmt.Sprintf("tenant-%d", i)
		lb := guestnetv1.LoadBalancerSpec{IP: fmt.Sprintf("10.2.%d.%d", i/200, i%200+1)}
		if i%5 == 0 {
			block := fmt.Sprintf("10.3.%d.%d", i/320, i%320/5*4)
			lb = guestnetv1.LoadBalancerSpec{CIDRs: []string{block + "/30"}, IP: block}
		}
		gi := &guestnetv1.GuestIngress{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", UID: types.UID(fmt.Sprintf("uid-%d", i)), Generation: 1,
				CreationTimestamp: metav1.NewTime(created.Add(time.Duration(i) * time.Second)), Finalizers: []string{guestnetv1.GuestIngressFinalizer}},
			Spec: guestnetv1.GuestIngressSpec{ClusterName: "guest", GuestService: guestnetv1.ObjectReference{Namespace: "ingress", Name: "envoy"},
				Ports: []guestnetv1.IngressPort{{Name: "http", Port: 80}}, LoadBalancer: lb},
		}
		svc := hostServiceAtRest(gi, admitted)
		l2, err := ingress.L2Policy(gi, admitted.Announcement)
		if err != nil {
			panic(err)
		}
		objs = append(objs, gi,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"tenant": "yes"}}},
			&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guest"}},
			svc, ingress.Pool(gi), l2)
		members = append(members, gi)
	}
	return objs, members
}

// hostServiceAtRest is gi's host Service as guestnet applies it (ingress.HostService), with
// the IP LB-IPAM gave it.
func hostServiceAtRest(gi *guestnetv1.GuestIngress, a ingress.Admission) *corev1.Service {
	raw, err := json.Marshal(ingress.HostService(gi, map[string]int32{"http": 30080}, a))
	if err != nil {
		panic(err)
	}
	svc := &corev1.Service{}
	if err := json.Unmarshal(raw, svc); err != nil {
		panic(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ingress.ClaimOf(gi).IP.String()}}
	return svc
}

// newCachedReconciler is a Reconciler whose client reads a real controller-runtime cache
// that holds objs, with the field indexes that indexes registers. Any request to an
// apiserver, and any write, fails the test.
func newCachedReconciler(tb testing.TB, indexes func(context.Context, client.FieldIndexer) error, objs ...client.Object) *Reconciler {
	tb.Helper()
	scheme, mapper := testSchemeAndMapper()
	byKind := map[schema.GroupVersionKind][]kruntime.Object{}
	for _, o := range objs {
		gvk, err := apiutil.GVKForObject(o, scheme)
		if err != nil {
			tb.Fatal(err)
		}
		o = o.DeepCopyObject().(client.Object)
		o.SetResourceVersion("1")
		byKind[gvk] = append(byKind[gvk], o)
	}
	noRequests := &http.Client{Transport: roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		tb.Errorf("request to an apiserver: %s %s", req.Method, req.URL)
		return nil, fmt.Errorf("no apiserver here")
	})}
	c, err := cache.New(&rest.Config{Host: "http://127.0.0.1:1"}, cache.Options{
		Scheme: scheme, Mapper: mapper, HTTPClient: noRequests,
		NewInformer: func(_ toolscache.ListerWatcher, obj kruntime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
			gvk, err := apiutil.GVKForObject(obj, scheme)
			if err != nil {
				tb.Fatal(err)
			}
			return toolscache.NewSharedIndexInformer(&servedList{scheme: scheme, gvk: gvk, items: byKind[gvk]}, obj, resync, indexers)
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	if err := indexes(ctx, c); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	// The cache starts an informer on the first read of its kind and waits for it: start
	// them all now, so that no reconcile measured pays for that.
	for _, items := range byKind {
		if _, err := c.GetInformer(ctx, items[0].(client.Object)); err != nil {
			tb.Fatal(err)
		}
	}
	if !c.WaitForCacheSync(ctx) {
		tb.Fatal("cache not synced")
	}
	rc := interceptor.NewClient(&cachedOnly{scheme: scheme, mapper: mapper, cache: c}, interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			return writeAtRest(tb)
		},
		Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error {
			return writeAtRest(tb)
		},
		Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			return writeAtRest(tb)
		},
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
			return writeAtRest(tb)
		},
		Apply: func(context.Context, client.WithWatch, kruntime.ApplyConfiguration, ...client.ApplyOption) error {
			return writeAtRest(tb)
		},
	})
	return &Reconciler{
		Client: rc, APIReader: c,
		ClusterCache:  clustercache.NewFakeEmptyClusterCache(),
		Admit:         policy.Admit,
		HostAddresses: hostaddrs.Fixed(hostaddrs.Set{}),
		// Cilium's LB-IPAM and L2 announcements only, as the fleet uses.
		CiliumBGP: optional.NewGate(optional.CiliumBGP, mapper, 0),
		MetalLB:   optional.NewGate(optional.MetalLB, mapper, 0),
		recorder:  events.NewFakeRecorder(1000),
	}
}

func writeAtRest(tb testing.TB) error {
	tb.Errorf("a reconcile of a fleet at rest writes")
	return fmt.Errorf("no writes at rest")
}

// cachedOnly reads from cache; the interceptor around it refuses every write.
type cachedOnly struct {
	client.WithWatch
	scheme *kruntime.Scheme
	mapper meta.RESTMapper
	cache  cache.Cache
}

func (c *cachedOnly) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.cache.Get(ctx, key, obj, opts...)
}

func (c *cachedOnly) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.cache.List(ctx, list, opts...)
}

func (c *cachedOnly) Scheme() *kruntime.Scheme    { return c.scheme }
func (c *cachedOnly) RESTMapper() meta.RESTMapper { return c.mapper }

// servedList lists its items once and then watches nothing: a kind at rest.
type servedList struct {
	scheme *kruntime.Scheme
	gvk    schema.GroupVersionKind
	items  []kruntime.Object
}

func (l *servedList) List(metav1.ListOptions) (kruntime.Object, error) {
	var list kruntime.Object = &unstructured.UnstructuredList{}
	if _, typed := l.scheme.AllKnownTypes()[l.gvk]; typed {
		var err error
		if list, err = l.scheme.New(l.gvk.GroupVersion().WithKind(l.gvk.Kind + "List")); err != nil {
			return nil, err
		}
	} else {
		list.GetObjectKind().SetGroupVersionKind(l.gvk.GroupVersion().WithKind(l.gvk.Kind + "List"))
	}
	if err := meta.SetList(list, l.items); err != nil {
		return nil, err
	}
	list.(metav1.ListInterface).SetResourceVersion("1")
	return list, nil
}

func (l *servedList) Watch(metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil }

// IsWatchListSemanticsUnSupported makes the reflector list, then watch.
func (l *servedList) IsWatchListSemanticsUnSupported() bool { return true }

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
