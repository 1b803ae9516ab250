package ownership

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

func gi(ns, name, cluster string) *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "uid-1"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  cluster,
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
		},
	}
}

func gwb(ns, name, cluster string) *guestnetv1.GuestWebhookBridge {
	return &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "uid-1"},
		Spec:       guestnetv1.GuestWebhookBridgeSpec{ClusterName: cluster},
	}
}

func TestLabelsAndOwnership(t *testing.T) {
	g := NewWithT(t)
	web := gi("k0smotron", "web", "tenant-a")
	g.Expect(Labels(web)).To(Equal(map[string]string{
		"app.kubernetes.io/managed-by":                             "guestnet",
		"cluster.x-k8s.io/cluster-name":                            "tenant-a",
		"guestnet.addons.cluster.x-k8s.io/guestingress-namespace":  "k0smotron",
		"guestnet.addons.cluster.x-k8s.io/guestingress-name":       "web",
		"guestnet.addons.cluster.x-k8s.io/guest-service-namespace": "projectcontour",
		"guestnet.addons.cluster.x-k8s.io/guest-service-name":      "envoy",
	}))
	for k, v := range Labels(gi("k0smotron", strings.Repeat("w", 253), "tenant-a")) {
		g.Expect(validation.IsValidLabelValue(v)).To(BeEmpty(), "label %s", k)
	}

	pool := &metav1.ObjectMeta{Name: hostnames.Pool(web), Labels: Labels(web), Annotations: Annotations(web)}
	g.Expect(IsOwnedBy(pool, web)).To(BeTrue())
	g.Expect(IsOwnedBy(pool, gi("other", "web", "tenant-a"))).To(BeFalse(), "same name, other namespace")
	key, ok := GuestIngressOf(pool)
	g.Expect(ok).To(BeTrue())
	g.Expect(key.String()).To(Equal("k0smotron/web"))

	foreign := &metav1.ObjectMeta{Name: hostnames.Pool(web)}
	g.Expect(IsOwnedBy(foreign, web)).To(BeFalse())
	_, ok = GuestIngressOf(foreign)
	g.Expect(ok).To(BeFalse())

	svc := &metav1.ObjectMeta{Namespace: "k0smotron", Name: hostnames.HostService(web), Labels: Labels(web),
		OwnerReferences: []metav1.OwnerReference{{Kind: "GuestIngress", Name: "web", UID: "uid-1", Controller: ptr.To(true)}}}
	g.Expect(IsOwnedBy(svc, web)).To(BeTrue())
	recreated := gi("k0smotron", "web", "tenant-a")
	recreated.UID = "uid-2"
	g.Expect(IsOwnedBy(svc, recreated)).To(BeFalse(), "a Service of a former GuestIngress of the same name")
	key, ok = GuestIngressOf(svc)
	g.Expect(ok).To(BeTrue())
	g.Expect(key.String()).To(Equal("k0smotron/web"))
}

// Pools and L2 policies are a GuestIngress's UID-exactly: one made for a former GuestIngress
// of the same name is not the new one's (the sweep deletes it), one made before guestnet
// recorded UIDs is adopted. Each carries the mark of the instance that made it.
func TestUIDAndInstanceMarks(t *testing.T) {
	g := NewWithT(t)
	web := gi("k0smotron", "web", "tenant-a")
	web.Labels = map[string]string{"cluster.x-k8s.io/watch-filter": "shard-1"}
	g.Expect(Annotations(web)).To(Equal(map[string]string{
		GuestIngressAnnotation:    "k0smotron/web",
		GuestIngressUIDAnnotation: "uid-1",
		WatchFilterAnnotation:     "shard-1",
	}))
	g.Expect(InstanceMark(web)).To(Equal("shard-1"))
	unlabelled := gi("k0smotron", "web", "tenant-a")
	g.Expect(Annotations(unlabelled)).NotTo(HaveKey(WatchFilterAnnotation), "no mark without a watch-filter label")

	pool := &metav1.ObjectMeta{Name: hostnames.Pool(web), Labels: Labels(web), Annotations: Annotations(web)}
	g.Expect(IsOwnedBy(pool, web)).To(BeTrue())
	g.Expect(MadeForUID(pool)).To(BeEquivalentTo("uid-1"))
	g.Expect(NeedsMarks(pool, web)).To(BeFalse())
	recreated := gi("k0smotron", "web", "tenant-a")
	recreated.UID = "uid-2"
	g.Expect(IsOwnedBy(pool, recreated)).To(BeFalse(), "a pool of a former GuestIngress of the same name")

	legacy := &metav1.ObjectMeta{Name: hostnames.Pool(web), Labels: Labels(web), Annotations: map[string]string{GuestIngressAnnotation: "k0smotron/web"}}
	g.Expect(IsOwnedBy(legacy, recreated)).To(BeTrue(), "made before UIDs were recorded: adopted by the GuestIngress of its name")
	g.Expect(MadeForUID(legacy)).To(BeEmpty())
	g.Expect(NeedsMarks(legacy, web)).To(BeTrue())

	svc := &metav1.ObjectMeta{Namespace: "k0smotron", Name: hostnames.HostService(web), Labels: Labels(web),
		OwnerReferences: []metav1.OwnerReference{{Kind: "GuestIngress", Name: "web", UID: "uid-1", Controller: ptr.To(true)}}}
	g.Expect(MadeForUID(svc)).To(BeEquivalentTo("uid-1"))

	for _, tc := range []struct {
		name   string
		mark   *string
		filter string
		want   bool
	}{
		{name: "an instance without a watch filter made all of them", mark: ptr.To("shard-1"), filter: "", want: true},
		{name: "unmarked, for an instance without a filter", filter: "", want: true},
		{name: "its own mark", mark: ptr.To("shard-1"), filter: "shard-1", want: true},
		{name: "another instance's mark", mark: ptr.To("shard-2"), filter: "shard-1"},
		{name: "unmarked, for an instance with a filter", filter: "shard-1"},
	} {
		obj := &metav1.ObjectMeta{Annotations: map[string]string{}}
		if tc.mark != nil {
			obj.Annotations[WatchFilterAnnotation] = *tc.mark
		}
		g.Expect(MadeByInstance(obj, tc.filter)).To(Equal(tc.want), tc.name)
	}
}

func TestBridgeLabelsAndOwnership(t *testing.T) {
	g := NewWithT(t)
	b := gwb("k0smotron", "bridge", "tenant-a")
	g.Expect(BridgeID(b)).To(Equal("k0smotron/bridge"))
	g.Expect(BridgeGuestLabels(b)).To(Equal(map[string]string{
		"app.kubernetes.io/managed-by":                      "guestnet",
		"guestnet.addons.cluster.x-k8s.io/bridge-namespace": "k0smotron",
		"guestnet.addons.cluster.x-k8s.io/bridge-name":      "bridge",
	}))
	g.Expect(BridgeHostLabels(b, "cert-manager", "cert-manager-webhook")).To(Equal(map[string]string{
		"app.kubernetes.io/managed-by":                             "guestnet",
		"cluster.x-k8s.io/cluster-name":                            "tenant-a",
		"guestnet.addons.cluster.x-k8s.io/bridge-namespace":        "k0smotron",
		"guestnet.addons.cluster.x-k8s.io/bridge-name":             "bridge",
		"guestnet.addons.cluster.x-k8s.io/guest-service-namespace": "cert-manager",
		"guestnet.addons.cluster.x-k8s.io/guest-service-name":      "cert-manager-webhook",
	}))
	// The bridge's selector finds its host and guest Services.
	for k, v := range SelectBridge(b) {
		g.Expect(BridgeGuestLabels(b)).To(HaveKeyWithValue(k, v))
		g.Expect(BridgeHostLabels(b, "ns", "svc")).To(HaveKeyWithValue(k, v))
	}
	// Label values stay valid for the longest bridge name.
	long := gwb("k0smotron", strings.Repeat("b", 253), "tenant-a")
	for k, v := range BridgeHostLabels(long, strings.Repeat("n", 63), strings.Repeat("s", 63)) {
		g.Expect(validation.IsValidLabelValue(v)).To(BeEmpty(), "label %s", k)
	}
	g.Expect(SelectBridge(long)).NotTo(Equal(SelectBridge(gwb("k0smotron", strings.Repeat("b", 252)+"c", "tenant-a"))))

	tests := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		want        bool
	}{
		{name: "labelled and annotated for the bridge", labels: BridgeGuestLabels(b), annotations: map[string]string{BridgeAnnotation: "k0smotron/bridge"}, want: true},
		{name: "host labels", labels: BridgeHostLabels(b, "a", "b"), annotations: map[string]string{BridgeAnnotation: "k0smotron/bridge"}, want: true},
		{name: "managed-by alone is enough with the annotation", labels: map[string]string{ManagedByLabel: ManagedByValue}, annotations: map[string]string{BridgeAnnotation: "k0smotron/bridge"}, want: true},
		{name: "another bridge's", labels: BridgeGuestLabels(b), annotations: map[string]string{BridgeAnnotation: "k0smotron/other"}},
		{name: "same name, other namespace", labels: BridgeGuestLabels(b), annotations: map[string]string{BridgeAnnotation: "team-b/bridge"}},
		{name: "not managed by guestnet", labels: map[string]string{"app": "x"}, annotations: map[string]string{BridgeAnnotation: "k0smotron/bridge"}},
		{name: "no annotation", labels: BridgeGuestLabels(b)},
		{name: "a GuestIngress's", labels: map[string]string{ManagedByLabel: ManagedByValue}, annotations: map[string]string{GuestIngressAnnotation: "k0smotron/bridge"}},
	}
	for _, tt := range tests {
		obj := &metav1.ObjectMeta{Labels: tt.labels, Annotations: tt.annotations}
		g.Expect(IsBridgeObject(obj, b)).To(Equal(tt.want), tt.name)
	}
}

// Every GuestIngress reconcile asks whose each pool and L2 policy of the host is (madeFor,
// held): reading a label or annotation of an Unstructured must not copy its maps, which cost
// the manager tens of MiB in flight at N=1,000 (docs/performance.md). Counted, not timed.
func TestReadingPoolMarksAllocatesNothing(t *testing.T) {
	g := NewWithT(t)
	owner := gi("tenant", "web", "c1")
	pool := &unstructured.Unstructured{Object: map[string]any{}}
	pool.SetName(hostnames.Pool(owner))
	pool.SetLabels(Labels(owner))
	pool.SetAnnotations(Annotations(owner))
	var key types.NamespacedName
	var owned, made, orphaned bool
	allocs := testing.AllocsPerRun(100, func() {
		key, _ = GuestIngressOf(pool)
		owned = IsOwnedBy(pool, owner)
		made = MadeByInstance(pool, "shard-a")
		orphaned = Orphaned(pool, owner, "")
	})
	g.Expect(key).To(Equal(types.NamespacedName{Namespace: "tenant", Name: "web"}))
	g.Expect(owned).To(BeTrue())
	g.Expect(made).To(BeFalse())
	g.Expect(orphaned).To(BeFalse())
	g.Expect(allocs).To(BeZero())
}
