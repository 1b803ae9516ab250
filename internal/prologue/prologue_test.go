package prologue

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
)

const finalizer = guestnetv1.GuestIngressFinalizer

func bridge(labels map[string]string) *guestnetv1.GuestWebhookBridge {
	return &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", Labels: labels},
		Spec:       guestnetv1.GuestWebhookBridgeSpec{ClusterName: "c"},
	}
}

func request() ctrl.Request {
	return ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "b"}}
}

func TestInWatchFilter(t *testing.T) {
	g := NewWithT(t)
	mine := bridge(map[string]string{clusterv1.WatchLabel: "a"})
	g.Expect(InWatchFilter(mine, "")).To(BeTrue(), "no filter: everything")
	g.Expect(InWatchFilter(mine, "a")).To(BeTrue())
	g.Expect(InWatchFilter(mine, "b")).To(BeFalse(), "another instance's")
	g.Expect(InWatchFilter(bridge(nil), "a")).To(BeFalse(), "unlabelled, with a filter")
}

func TestGet(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	for name, tc := range map[string]struct {
		objects     []client.Object
		filter      string
		stale       bool
		wantOK      bool
		wantCluster bool
	}{
		"gone":                   {wantOK: false},
		"another instance's":     {objects: []client.Object{bridge(map[string]string{clusterv1.WatchLabel: "other"}), cluster}, filter: "mine"},
		"mine, with its Cluster": {objects: []client.Object{bridge(map[string]string{clusterv1.WatchLabel: "mine"}), cluster}, filter: "mine", wantOK: true, wantCluster: true},
		"no Cluster yet":         {objects: []client.Object{bridge(nil)}, wantOK: true},
		"stale read":             {objects: []client.Object{bridge(nil), cluster}, stale: true},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(tc.objects...).Build()
			r := Reader{Client: c, WatchFilterValue: tc.filter, OwnWrites: &status.OwnWrites{}}
			if tc.stale {
				live := &guestnetv1.GuestWebhookBridge{}
				g.Expect(c.Get(context.Background(), request().NamespacedName, live)).To(Succeed())
				r.OwnWrites.Replaced(request().NamespacedName, live.ResourceVersion)
			}
			_, got, ok, err := r.Get(context.Background(), request(), &guestnetv1.GuestWebhookBridge{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ok).To(Equal(tc.wantOK))
			g.Expect(got != nil).To(Equal(tc.wantCluster))
		})
	}
}

func TestStoreFinalizer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(bridge(nil)).Build()
	r := Reader{Client: c, OwnWrites: &status.OwnWrites{}}
	obj := &guestnetv1.GuestWebhookBridge{}
	g.Expect(c.Get(ctx, request().NamespacedName, obj)).To(Succeed())
	before := obj.DeepCopy()
	read := obj.ResourceVersion

	g.Expect(r.StoreFinalizer(ctx, before, obj, finalizer)).To(Succeed())
	live := &guestnetv1.GuestWebhookBridge{}
	g.Expect(c.Get(ctx, request().NamespacedName, live)).To(Succeed())
	g.Expect(live.Finalizers).To(ConsistOf(finalizer), "stored")
	g.Expect(obj.Finalizers).To(ConsistOf(finalizer))
	g.Expect(before.Finalizers).To(ConsistOf(finalizer))
	g.Expect(obj.ResourceVersion).To(Equal(live.ResourceVersion), "the reconcile goes on from the stored version")
	g.Expect(before.ResourceVersion).To(Equal(live.ResourceVersion))
	g.Expect(r.OwnWrites.Stale(&guestnetv1.GuestWebhookBridge{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", ResourceVersion: read}})).
		To(BeTrue(), "a cache still holding the version read is stale")

	// Again: nothing to write.
	stored := live.ResourceVersion
	g.Expect(r.StoreFinalizer(ctx, before, obj, finalizer)).To(Succeed())
	g.Expect(c.Get(ctx, request().NamespacedName, live)).To(Succeed())
	g.Expect(live.ResourceVersion).To(Equal(stored))

	// A stale before (the object changed since it was read) is refused, not overwritten.
	other := bridge(nil)
	other.Name = "b2"
	g.Expect(c.Create(ctx, other)).To(Succeed())
	staleBefore := other.DeepCopy()
	other.Labels = map[string]string{"changed": "yes"}
	g.Expect(c.Update(ctx, other)).To(Succeed())
	g.Expect(r.StoreFinalizer(ctx, staleBefore, staleBefore.DeepCopy(), finalizer)).NotTo(Succeed())
}
