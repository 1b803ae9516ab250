package ports

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Without CAPK's CRD a MachineDeployment that names a KubevirtMachineTemplate gets a template
// error that says what to install; the read does not fail the reconcile.
func TestListWorkersWithoutCAPK(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	utilruntime.Must(clusterv1.AddToScheme(scheme))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-md-0", Labels: map[string]string{clusterv1.ClusterNameLabel: "c"}},
		Spec: clusterv1.MachineDeploymentSpec{ClusterName: "c", Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
			ClusterName: "c",
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: KubevirtMachineTemplateGVK.Group, Kind: KubevirtMachineTemplateGVK.Kind, Name: "c-md-0",
			},
		}}},
	}
	host := fake.NewClientBuilder().WithScheme(scheme).WithObjects(md).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*unstructured.Unstructured); ok {
				return &meta.NoKindMatchError{GroupKind: KubevirtMachineTemplateGVK.GroupKind(), SearchedVersions: []string{"v1alpha1"}}
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()

	workers, err := ListWorkers(context.Background(), host, cluster, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(workers).To(HaveLen(1))
	g.Expect(workers[0].TemplateErr).To(MatchError(ContainSubstring("install Cluster API Provider KubeVirt")))
}
