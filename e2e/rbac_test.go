package e2e

// The generated RBAC (config/rbac, from the controllers' markers) is all the manager needs:
// it runs here as a ServiceAccount bound to exactly those roles, does a GuestIngress and a
// GuestWebhookBridge from creation to deletion, and its log shows no request refused.
// docs/rbac.md explains every rule; TestDocsRBAC checks the page lists them all.

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

func TestRBAC_TheGeneratedRolesAreEnoughForTheManager(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("rbac")
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())

	// The manager as a ServiceAccount with the ClusterRole exactly as generated and the leader
	// election Role (the manager here does not elect a leader; the Role is bound anyway, as
	// deployed); the test reads its log.
	m := runManagerAsServiceAccount(t, l, ns, lab.ManagerFlags{Namespace: ns})

	// A GuestIngress, Ready: Services, Cilium pool and policy, EndpointSlices, events.
	startCiliumStandIn(t, l)
	gc := createIngressCluster(t, l, ns, "tenant-a", 31580, 31581)
	addEnvoyWorker(t, l, gc, ns+"-md-0-a", "10.244.70.11", 31580, 31581)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, "10.98.70.10", ptr.To[int32](31580), ptr.To[int32](31581))
	eventuallyGuestIngressReady(t, l, gi)

	// A GuestWebhookBridge that bridges a webhook: its host Service, owned by the bridge.
	webhookNS := uniqueName("cert-manager")
	wh, err := lab.CreateServiceWebhook(ctx, l.Guest.Client, l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = l.Guest.Client.Delete(context.Background(), wh.Config) })
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bridge"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        gc.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: 31580, Size: 1},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	// The range's only port is the GuestIngress's: the bridge says so (a condition patch).
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	g.Eventually(func() string {
		got := &guestnetv1.GuestWebhookBridge{}
		_ = host.Get(ctx, client.ObjectKeyFromObject(gwb), got)
		return conditions.GetReason(got, guestnetv1.TargetsBridgedCondition)
	}).WithTimeout(giTimeout).Should(Equal(guestnetv1.NodePortRangeExhaustedReason))
	g.Expect(updateBridge(ctx, host, gwb, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.NodePortRange = guestnetv1.NodePortRange{Start: 31590, Size: 2}
	})).To(Succeed())
	g.Eventually(func() bool {
		got := &guestnetv1.GuestWebhookBridge{}
		_ = host.Get(ctx, client.ObjectKeyFromObject(gwb), got)
		return conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)
	}).WithTimeout(giTimeout).Should(BeTrue())

	// Deletion: finalizers released, host objects gone.
	g.Expect(host.Delete(ctx, gwb)).To(Succeed())
	g.Expect(host.Delete(ctx, gi)).To(Succeed())
	for _, obj := range []client.Object{gwb, gi} {
		g.Eventually(func() bool { return apierrors.IsNotFound(host.Get(ctx, client.ObjectKeyFromObject(obj), obj)) }).
			WithTimeout(giTimeout).Should(BeTrue(), "%T %s is deleted", obj, obj.GetName())
	}

	m.Stop()
	for _, line := range strings.Split(m.Log(), "\n") {
		g.Expect(line).NotTo(ContainSubstring("forbidden"), "the manager was refused a request: the generated RBAC lacks a rule")
	}
	g.Expect(m.Log()).To(ContainSubstring("Reconcile"), "the log is the manager's")
}

func readYAML(g Gomega, path string, into any) {
	data, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.Unmarshal(data, into)).To(Succeed())
}

func updateBridge(ctx context.Context, c client.Client, gwb *guestnetv1.GuestWebhookBridge, mutate func(*guestnetv1.GuestWebhookBridge)) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := &guestnetv1.GuestWebhookBridge{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(gwb), got); err != nil {
			return err
		}
		mutate(got)
		err := c.Update(ctx, got)
		if !apierrors.IsConflict(err) || time.Now().After(deadline) {
			return err
		}
	}
}
