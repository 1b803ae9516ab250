package ports

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// No port exists only for SSH: 22 is required when CAPK SSHes into the VMs, not otherwise.
func TestBaseRequires22OnlyForCAPKsSSHCheck(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Base(false).Ports()).To(Equal([]Port{TCP(10250)}))
	g.Expect(Base(true).Ports()).To(Equal([]Port{TCP(22), TCP(10250)}))
	g.Expect(Base(true)[0].Reasons).To(ConsistOf(ContainSubstring("CAPK's ssh bootstrap check")))
}

func TestCAPKWillSSH(t *testing.T) {
	kubevirtCluster := func(annotations map[string]string) client.Object {
		kc := &unstructured.Unstructured{}
		kc.SetGroupVersionKind(KubevirtClusterGVK)
		kc.SetNamespace("ns")
		kc.SetName("guest")
		kc.SetAnnotations(annotations)
		return kc
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guest"}, Spec: clusterv1.ClusterSpec{
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: KubevirtClusterGVK.Group, Kind: KubevirtClusterGVK.Kind, Name: "guest"},
	}}
	for name, tc := range map[string]struct {
		objects []client.Object
		cluster *clusterv1.Cluster
		want    bool
	}{
		"externally managed (k0smotron's templates)":   {objects: []client.Object{kubevirtCluster(map[string]string{clusterv1.ManagedByAnnotation: "k0smotron"})}, cluster: cluster},
		"managed by CAPK: it generates keys and SSHes": {objects: []client.Object{kubevirtCluster(nil)}, cluster: cluster, want: true},
		"not created yet: as before, 22":               {cluster: cluster, want: true},
		"another infrastructure":                       {cluster: &clusterv1.Cluster{ObjectMeta: cluster.ObjectMeta}, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(tc.objects...).Build()
			got, err := CAPKWillSSH(context.Background(), c, tc.cluster)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}
