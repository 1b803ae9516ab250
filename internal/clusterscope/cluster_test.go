package clusterscope

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
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
