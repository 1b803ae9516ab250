package status

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// patchEnv is a fake apiserver holding one GuestIngress, counting writes.
func patchEnv(t *testing.T) (client.Client, *guestnetv1.GuestIngress, *[]string) {
	t.Helper()
	var writes []string
	gi := newGuestIngress()
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithStatusSubresource(&guestnetv1.GuestIngress{}).WithObjects(gi).
		WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				writes = append(writes, "patch")
				return c.Patch(ctx, obj, patch, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				writes = append(writes, "patch/"+sub)
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		}).Build()
	stored := &guestnetv1.GuestIngress{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(gi), stored); err != nil {
		t.Fatal(err)
	}
	return c, stored, &writes
}

func TestPatchWritesConditionsAndStatusInOneWrite(t *testing.T) {
	g := NewWithT(t)
	c, before, writes := patchEnv(t)
	gi := before.DeepCopy()
	conditions.Set(gi, metav1.Condition{Type: guestnetv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.ReadyReason})
	gi.Status.LoadBalancerIP = "10.2.6.10"
	gi.Status.ObservedGeneration = gi.Generation

	written, err := Patch(context.Background(), c, before, gi)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeTrue())
	g.Expect(*writes).To(Equal([]string{"patch/status"}))

	got := &guestnetv1.GuestIngress{}
	g.Expect(c.Get(context.Background(), client.ObjectKeyFromObject(gi), got)).To(Succeed())
	g.Expect(got.Status.LoadBalancerIP).To(Equal("10.2.6.10"))
	g.Expect(got.Status.ObservedGeneration).To(Equal(gi.Generation))
	g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue())
	g.Expect(gi.Status.LoadBalancerIP).To(Equal("10.2.6.10"), "obj keeps what the reconcile derived")
}

func TestPatchWritesNothingWhenNothingChanged(t *testing.T) {
	g := NewWithT(t)
	c, before, writes := patchEnv(t)
	written, err := Patch(context.Background(), c, before, before.DeepCopy())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeFalse())
	g.Expect(*writes).To(BeEmpty())
}

func TestPatchWritesFinalizersApartFromStatus(t *testing.T) {
	g := NewWithT(t)
	c, before, writes := patchEnv(t)
	gi := before.DeepCopy()
	gi.Finalizers = []string{guestnetv1.GuestIngressFinalizer}
	gi.Status.LoadBalancerIP = "10.2.6.10"
	_, err := Patch(context.Background(), c, before, gi)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(*writes).To(Equal([]string{"patch/status", "patch"}))
}

// A status derived from a stale object is refused, not written over a newer one.
func TestPatchRefusesAStaleObject(t *testing.T) {
	g := NewWithT(t)
	c, before, _ := patchEnv(t)
	newer := before.DeepCopy()
	newer.Status.LoadBalancerIP = "10.2.6.11"
	g.Expect(c.Status().Update(context.Background(), newer)).To(Succeed())

	gi := before.DeepCopy()
	gi.Status.ReadyEndpoints = 2
	_, err := Patch(context.Background(), c, before, gi)
	g.Expect(apierrors.IsConflict(err)).To(BeTrue(), "%v", err)
}

func TestOwnWrites(t *testing.T) {
	g := NewWithT(t)
	w := &OwnWrites{}
	gi := newGuestIngress()
	gi.ResourceVersion = "5"
	g.Expect(w.Stale(gi)).To(BeFalse())
	w.Replaced(client.ObjectKeyFromObject(gi), "5")
	w.Replaced(client.ObjectKeyFromObject(gi), "6")
	g.Expect(w.Stale(gi)).To(BeTrue(), "the cache has not seen the write that replaced 5")
	gi.ResourceVersion = "6"
	g.Expect(w.Stale(gi)).To(BeTrue())
	gi.ResourceVersion = "7"
	g.Expect(w.Stale(gi)).To(BeFalse(), "the cache has the last write")
	w.Forget(client.ObjectKeyFromObject(gi))
	gi.ResourceVersion = "5"
	g.Expect(w.Stale(gi)).To(BeFalse())
}
