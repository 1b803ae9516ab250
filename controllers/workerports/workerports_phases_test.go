package workerports

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// A template this reconcile just pointed a MachineDeployment at must survive even when the
// cache has not seen the repoint yet: deletion is decided on what the API server says.
func TestDeleteUnusedTemplatesTrustsTheAPIServerNotAStaleCache(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(clusterv1.AddToScheme(scheme)).To(Succeed())
	g.Expect(guestnetv1.AddToScheme(scheme)).To(Succeed())

	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	md := func(template string) *clusterv1.MachineDeployment {
		m := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "md-0", Labels: map[string]string{clusterv1.ClusterNameLabel: "c"}}}
		m.Spec.ClusterName = "c"
		m.Spec.Template.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
			APIGroup: ports.KubevirtMachineTemplateGVK.Group, Kind: ports.KubevirtMachineTemplateGVK.Kind, Name: template,
		}
		return m
	}
	generated := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
		u.SetNamespace("ns")
		u.SetName(name)
		u.SetLabels(map[string]string{guestnetv1.GeneratedTemplateLabel: "c"})
		return u
	}

	// The cache still sees md-0 on the old generated template; the API server already has
	// it on the new one.
	stale := fake.NewClientBuilder().WithScheme(scheme).WithObjects(md("md-0-old"), generated("md-0-old"), generated("md-0-new")).Build()
	live := fake.NewClientBuilder().WithScheme(scheme).WithObjects(md("md-0-new")).Build()
	r := &Reconciler{Client: stale, APIReader: live, recorder: events.NewFakeRecorder(10)}

	g.Expect(r.deleteUnusedTemplates(context.Background(), &scope{cluster: cluster})).To(Succeed())

	remaining := &unstructured.UnstructuredList{}
	remaining.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtMachineTemplateList"))
	g.Expect(stale.List(context.Background(), remaining, client.InNamespace("ns"))).To(Succeed())
	var names []string
	for _, u := range remaining.Items {
		names = append(names, u.GetName())
	}
	g.Expect(names).To(ContainElement("md-0-new"), "the API server says md-0 uses it: it must not be deleted")
}
