package guestingress

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
)

// Without Cilium's CRDs a GuestIngress reads and writes nothing, and says what to install:
// Ready and LoadBalancerReady are False with CiliumLBIPAMNotInstalled.
func TestReconcileNormalWithoutCilium(t *testing.T) {
	g := NewWithT(t)
	r := newFakeReconciler(t)
	r.Cilium = optional.NewGate(optional.CiliumLBIPAM, meta.NewDefaultRESTMapper(nil), 0)
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	s := &scope{guestIngress: gi}

	_, err := r.reconcileNormal(context.Background(), s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.observed).To(BeNil(), "nothing is observed")
	updateStatus(s)

	for _, typ := range []string{guestnetv1.LoadBalancerReadyCondition, guestnetv1.ReadyCondition} {
		c := conditions.Get(gi, typ)
		g.Expect(c).NotTo(BeNil(), typ)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse), typ)
		g.Expect(c.Reason).To(Equal(guestnetv1.CiliumLBIPAMNotInstalledReason), typ)
		g.Expect(c.Message).To(And(ContainSubstring("CiliumLoadBalancerIPPool"), ContainSubstring("install Cilium"),
			ContainSubstring("without a restart")), typ)
	}
}

// Without Cilium's CRDs a deletion has no pool or L2 policy to delete: the finalizer goes.
func TestReconcileDeleteWithoutCilium(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(clusterv1.AddToScheme(scheme))
	utilruntime.Must(guestnetv1.AddToScheme(scheme))
	mapper := meta.NewDefaultRESTMapper(nil) // no Cilium kinds
	for gvk := range scheme.AllKnownTypes() {
		mapper.Add(gvk, meta.RESTScopeNamespace)
	}
	r := newFakeReconciler(t)
	// As the manager's client answers for a kind the apiserver does not serve.
	c := fake.NewClientBuilder().WithScheme(scheme).WithRESTMapper(mapper).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				return &meta.NoKindMatchError{GroupKind: u.GroupVersionKind().GroupKind(), SearchedVersions: []string{u.GroupVersionKind().Version}}
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	r.Client, r.APIReader = c, c
	r.Cilium = optional.NewGate(optional.CiliumLBIPAM, mapper, 0)
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: "web", DeletionTimestamp: &metav1.Time{Time: time.Now()},
		Finalizers: []string{guestnetv1.GuestIngressFinalizer},
	}}

	_, err := r.reconcileDelete(context.Background(), &scope{guestIngress: gi})

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gi.Finalizers).To(BeEmpty())
}
