package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
)

// A guest that holds more Services than the manager's --guest-max-objects is not served: its
// bridge says GuestTooLarge, what to delete and the cap, and changes nothing; once the guest
// is back under the cap, the same manager bridges again. (The shipped binary, with the cap set
// just above what the shared lab's guest holds, as a ServiceAccount with the generated RBAC.)
func TestGuestBounds_AGuestPastTheCapIsRefusedUntilItShrinks(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	host, guest := l.Host.Client, l.Guest.Client
	ns := uniqueName("bounds")
	gc, err := l.CreateGuestCluster(ctx, ns, "guest", lab.WorkerTemplateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	webhookNS := uniqueName("bounds-webhook")
	wh, err := lab.CreateServiceWebhook(ctx, guest, l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = guest.Delete(context.Background(), wh.Config) })

	// The cap: the guest's Services now, the bridge's own guest Service and one to spare, or
	// what the guest has of the other kinds guestnet caches, if more.
	count := func(gvk schema.GroupVersionKind) int {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		g.Expect(guest.List(ctx, list)).To(Succeed())
		return len(list.Items)
	}
	servicesNow, limit := count(guestbounds.Kinds[0]), 0
	limit = servicesNow + 2
	for _, gvk := range guestbounds.Kinds[1:] {
		limit = max(limit, count(gvk)+1)
	}
	// The shipped binary as a ServiceAccount with the generated RBAC.
	runManagerAsServiceAccount(t, l, ns, lab.ManagerFlags{Namespace: ns, Args: []string{
		fmt.Sprintf("--guest-max-objects=%d", limit), "--guest-recount-period=" + guestbounds.DefaultCheckEvery.String(),
	}})

	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bridge"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        gc.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: 32140, Size: 1},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	get := func() *guestnetv1.GuestWebhookBridge {
		got := &guestnetv1.GuestWebhookBridge{}
		g.Expect(host.Get(ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
		return got
	}
	touch := func() { // a reconcile now (the count is kept a minute)
		g.Expect(updateBridge(ctx, host, gwb, func(b *guestnetv1.GuestWebhookBridge) {
			metav1.SetMetaDataAnnotation(&b.ObjectMeta, "e2e.guestnet.dev/touch", time.Now().String())
		})).To(Succeed())
	}
	g.Eventually(func() bool { return conditions.IsTrue(get(), guestnetv1.TargetsBridgedCondition) }).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "under the cap, the bridge works")

	// Past the cap.
	extraNS := uniqueName("bounds-extra")
	g.Expect(guest.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: extraNS}})).To(Succeed())
	var extra []*corev1.Service
	for i := range limit - servicesNow + 1 { // with the bridge's own: two past the cap
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: extraNS, Name: fmt.Sprintf("svc-%d", i)},
			Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}},
		}
		g.Expect(guest.Create(ctx, svc)).To(Succeed())
		extra = append(extra, svc)
	}
	before := get()
	time.Sleep(guestbounds.DefaultCheckEvery + 2*time.Second)
	touch()
	t.Run("past-the-cap-GuestTooLarge", func(t *testing.T) {
		g := NewWithT(t)
		var c *metav1.Condition
		g.Eventually(func() string {
			c = conditions.Get(get(), guestnetv1.ClusterAvailableCondition)
			return c.Reason
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Equal(guestnetv1.GuestTooLargeReason))
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Message).To(And(ContainSubstring("more than %d Services", limit), ContainSubstring("delete Services in the guest"),
			ContainSubstring("--guest-max-objects")))
		ready := conditions.Get(get(), guestnetv1.ReadyCondition)
		g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(ready.Reason).To(Equal(guestnetv1.GuestTooLargeReason))
		// Nothing was changed: the targets as the last reconcile under the cap left them.
		g.Expect(get().Status.Targets).To(Equal(before.Status.Targets))
	})

	// Back under the cap: bridged again, without a restart.
	for _, svc := range extra {
		g.Expect(guest.Delete(ctx, svc)).To(Succeed())
	}
	time.Sleep(guestbounds.DefaultCheckEvery + 2*time.Second)
	touch()
	t.Run("under-the-cap-again", func(t *testing.T) {
		NewWithT(t).Eventually(func(g Gomega) {
			got := get()
			g.Expect(conditions.GetReason(got, guestnetv1.ClusterAvailableCondition)).To(Equal(guestnetv1.ClusterAvailableReason))
			g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue())
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	})
}
