package clusterscope

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func TestIndexByClusterName(t *testing.T) {
	g := NewWithT(t)

	g.Expect(IndexByClusterName(newGuestIngress())).To(Equal([]string{"guest"}))
	g.Expect(IndexByClusterName(&guestnetv1.GuestWebhookBridge{
		Spec: guestnetv1.GuestWebhookBridgeSpec{ClusterName: "other"},
	})).To(Equal([]string{"other"}))
	g.Expect(IndexByClusterName(&guestnetv1.GuestNodeIdentity{
		Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: "third"},
	})).To(Equal([]string{"third"}), "every kind that names a Cluster")
	g.Expect(IndexByClusterName(&guestnetv1.GuestIngress{})).To(BeEmpty())
	g.Expect(IndexByClusterName(&corev1.Service{})).To(BeEmpty())
}

func TestClusterToObjects(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(guestnetv1.AddToScheme(scheme)).To(Succeed())
	g.Expect(clusterv1.AddToScheme(scheme)).To(Succeed())

	bridge := func(namespace, name, clusterName string) *guestnetv1.GuestWebhookBridge {
		return &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec:       guestnetv1.GuestWebhookBridgeSpec{ClusterName: clusterName},
		}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithIndex(&guestnetv1.GuestWebhookBridge{}, ClusterNameField, IndexByClusterName).
		WithObjects(
			bridge("k0smotron", "metrics", "guest"),
			bridge("k0smotron", "cert-manager", "guest"),
			bridge("k0smotron", "unrelated", "another-guest"),
			// Same cluster name, other namespace: another Cluster altogether.
			bridge("elsewhere", "metrics", "guest"),
		).Build()

	toBridges := ClusterToObjects(c, func() client.ObjectList { return &guestnetv1.GuestWebhookBridgeList{} })

	g.Expect(toBridges(context.Background(), newCluster())).To(ConsistOf(
		reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "k0smotron", Name: "metrics"}},
		reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "k0smotron", Name: "cert-manager"}},
	))
}
