package guestingress_test

// Held within admitted and the sweep (docs/decisions/0008-held-within-admitted.md), against
// the lab's real host apiserver and Cilium's real CRDs and LB-IPAM. The tenant's switches are
// tried end to end, as a tenant against the shipped manager, in e2e/held_test.go.

import (
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

// Pools and L2 policies are a GuestIngress's UID-exactly. One made by an older guestnet (no
// UID) is adopted, not deleted. A GuestIngress whose finalizer was removed and that was
// created again under the same name is another one: what was made for the first is swept,
// and the second gets its own.
func TestGuestIngressHeld_SweepIsUIDExact(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	first := e.eventuallyReady(gi)
	name := e.ns + ".tenant-a-web"
	pool := e.getCilium(ingress.PoolGVK.Kind, name)
	e.g.Expect(pool.GetAnnotations()).To(HaveKeyWithValue(ownership.GuestIngressUIDAnnotation, string(first.UID)))

	// An older guestnet's objects: no UID. Adopted by the GuestIngress of their name.
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			u := e.getCilium(kind, name)
			a := u.GetAnnotations()
			delete(a, ownership.GuestIngressUIDAnnotation)
			u.SetAnnotations(a)
			return e.host.Update(e.ctx, u)
		})).To(Succeed())
	}
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		e.g.Eventually(func() map[string]string { return e.getCilium(kind, name).GetAnnotations() }).WithTimeout(waitTimeout).WithPolling(poll).
			Should(HaveKeyWithValue(ownership.GuestIngressUIDAnnotation, string(first.UID)), "%s adopted", kind)
	}
	e.g.Expect(e.getCilium(ingress.PoolGVK.Kind, name).GetUID()).To(Equal(pool.GetUID()), "adopted, not replaced")
	e.eventuallyEvent(first.UID, corev1.EventTypeNormal, "Applied", "Marked CiliumLoadBalancerIPPool "+name+" with the UID of this GuestIngress")

	// The finalizer removed, the GuestIngress deleted and created again at once.
	oldPool, oldPolicy := pool.GetUID(), e.getCilium(ingress.L2PolicyGVK.Kind, name).GetUID()
	oldService := e.getHostService("tenant-a-web").UID
	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Finalizers = nil })
	e.g.Expect(e.host.Delete(e.ctx, first)).To(Succeed())
	e.eventuallyGone(gi)
	second := e.eventuallyReady(e.createGuestIngress("web", gc.Name))
	e.g.Expect(second.UID).NotTo(Equal(first.UID))
	e.g.Eventually(func(g Gomega) {
		for kind, old := range map[string]types.UID{ingress.PoolGVK.Kind: oldPool, ingress.L2PolicyGVK.Kind: oldPolicy} {
			u, err := e.tryGetCilium(kind, name)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(u.GetUID()).NotTo(Equal(old), "the %s made for the former GuestIngress is kept", kind)
			g.Expect(u.GetAnnotations()).To(HaveKeyWithValue(ownership.GuestIngressUIDAnnotation, string(second.UID)))
		}
		svc, err := e.tryGetHostService("tenant-a-web")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(svc.UID).NotTo(Equal(oldService))
		g.Expect(ownership.MadeForUID(svc)).To(Equal(second.UID))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())

	// Gone for good, its finalizer removed: nothing is left.
	e.updateGuestIngress(second, func(gi *guestnetv1.GuestIngress) { gi.Finalizers = nil })
	e.g.Expect(e.host.Delete(e.ctx, second)).To(Succeed())
	e.g.Eventually(func(g Gomega) {
		for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
			_, err := e.tryGetCilium(kind, name)
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s left: %v", kind, err)
		}
		_, err := e.tryGetHostService("tenant-a-web")
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "host Service left: %v", err)
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
}

// A tenant strips guestnet's labels from its host Service (the manager's cache no longer holds
// it), and the GuestIngress is no longer admitted: the host Service goes all the same, read
// past the cache. (The manager is stopped meanwhile, so that no reconcile puts the labels back
// or withdraws the Service before both happened.)
func TestGuestIngressHeld_StrippedLabelsKeepNothing(t *testing.T) {
	t.Parallel()
	var refuse atomic.Bool
	admit := func(in policy.Input) policy.Decision {
		if refuse.Load() {
			return policy.Decision{Reason: guestnetv1.NotAllowedReason, Message: "GuestIngressPolicy test no longer allows it"}
		}
		return policy.Admit(in)
	}
	e := newPhaseEnv(t, envOptions{manual: true})
	stop := e.runManager(admitSetup(admit))
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)
	e.g.Expect(stop()).To(Succeed())

	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := e.getHostService("tenant-a-web")
		svc.Labels = map[string]string{"app": "mine"}
		return e.host.Update(e.ctx, svc, client.FieldOwner("kubectl-edit"))
	})).To(Succeed())
	refuse.Store(true)
	e.runManager(admitSetup(admit))
	e.eventuallyCondition(gi, guestnetv1.AdmittedCondition, metav1.ConditionFalse, guestnetv1.NotAllowedReason)
	e.g.Eventually(func() error { _, err := e.tryGetHostService("tenant-a-web"); return err }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Satisfy(apierrors.IsNotFound), "the host Service without guestnet's labels is kept")
}
