package clusterscope

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func TestGetCluster(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(clusterv1.AddToScheme(scheme)).To(Succeed())
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(newCluster()).Build()

	cluster, err := GetCluster(context.Background(), c, "k0smotron", "guest")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cluster.Name).To(Equal("guest"))

	cluster, err = GetCluster(context.Background(), c, "elsewhere", "guest")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cluster).To(BeNil())
}

func TestConnect(t *testing.T) {
	guestClient := fake.NewClientBuilder().Build()
	connected := clustercache.NewFakeClusterCache(guestClient, client.ObjectKey{Namespace: "k0smotron", Name: "guest"})
	notConnected := clustercache.NewFakeEmptyClusterCache()

	tests := []struct {
		name       string
		cache      clustercache.ClusterCache
		cluster    *clusterv1.Cluster
		wantClient bool
		wantReason string
	}{
		{name: "no Cluster", cache: connected, cluster: nil, wantReason: guestnetv1.ClusterNotFoundReason},
		{name: "not provisioned", cache: connected, cluster: newCluster(), wantReason: guestnetv1.ClusterNotProvisionedReason},
		{name: "not connected yet", cache: notConnected, cluster: newCluster(provisioned), wantReason: guestnetv1.GuestUnreachableReason},
		{name: "connected", cache: connected, cluster: newCluster(provisioned), wantClient: true, wantReason: guestnetv1.ClusterAvailableReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := newGuestIngress()

			c, err := Connect(context.Background(), tt.cache, obj, tt.cluster)

			// "Not yet" is never an error: events bring the object back.
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c != nil).To(Equal(tt.wantClient))
			g.Expect(conditions.GetReason(obj, guestnetv1.ClusterAvailableCondition)).To(Equal(tt.wantReason))
		})
	}
}

// tracker is a ClusterCache that has not connected to any guest and says whether it tried.
type tracker struct {
	clustercache.ClusterCache
	tried bool
}

func (t tracker) Tried(context.Context, client.ObjectKey) bool { return t.tried }

// A manager that has just started has not tried to connect to the guest yet: that says
// nothing of the guest, so what the object reported stays (a restart of guestnet is no
// outage of every tenant's guest). Once it tried and failed, the guest is unreachable.
func TestConnectBeforeTheFirstTryKeepsWhatWasReported(t *testing.T) {
	available := func() *guestnetv1.GuestIngress {
		obj := newGuestIngress()
		conditions.Set(obj, metav1.Condition{Type: guestnetv1.ClusterAvailableCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.ClusterAvailableReason})
		return obj
	}
	tests := []struct {
		name       string
		obj        *guestnetv1.GuestIngress
		tried      bool
		wantReason string
	}{
		{name: "not tried yet, available before", obj: available(), wantReason: guestnetv1.ClusterAvailableReason},
		{name: "tried and failed, available before", obj: available(), tried: true, wantReason: guestnetv1.GuestUnreachableReason},
		{name: "not tried yet, nothing reported before", obj: newGuestIngress(), wantReason: guestnetv1.GuestUnreachableReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			cache := tracker{ClusterCache: clustercache.NewFakeEmptyClusterCache(), tried: tt.tried}

			c, err := Connect(context.Background(), cache, tt.obj, newCluster(provisioned))

			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c).To(BeNil())
			g.Expect(conditions.GetReason(tt.obj, guestnetv1.ClusterAvailableCondition)).To(Equal(tt.wantReason))

			_, guestErr := GuestClient(context.Background(), cache, newCluster(provisioned))
			g.Expect(errors.Is(guestErr, clustercache.ErrClusterNotConnected)).To(BeTrue())
			g.Expect(NotTriedYet(guestErr)).To(Equal(!tt.tried))
		})
	}
}

// connectingTracker is a ClusterCache whose first try to connect ends, and fails, while a
// controller asks it for a client: GetClient answers "not connected" from before the try,
// Tried answers from after it.
type connectingTracker struct {
	clustercache.ClusterCache
	tried *bool
}

func (t connectingTracker) GetClient(ctx context.Context, key client.ObjectKey) (client.Client, error) {
	c, err := t.ClusterCache.GetClient(ctx, key)
	*t.tried = true
	return c, err
}

func (t connectingTracker) Tried(context.Context, client.ObjectKey) bool { return *t.tried }

// "Not connected" read before the first try is "not tried yet", even when the try ends before
// Tried is asked: the try's own event brings the object back, to report what it found. A
// restarted manager that said "unreachable" there wrote a status it took back at once.
func TestGuestClientNotConnectedBeforeTheFirstTryEndsIsNotTriedYet(t *testing.T) {
	g := NewWithT(t)
	cache := connectingTracker{ClusterCache: clustercache.NewFakeEmptyClusterCache(), tried: new(bool)}
	obj := newGuestIngress()
	conditions.Set(obj, metav1.Condition{Type: guestnetv1.ClusterAvailableCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.ClusterAvailableReason})

	_, err := Connect(context.Background(), cache, obj, newCluster(provisioned))

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(conditions.GetReason(obj, guestnetv1.ClusterAvailableCondition)).To(Equal(guestnetv1.ClusterAvailableReason))
}
