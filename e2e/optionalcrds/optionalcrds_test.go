// Package optionalcrds runs guestnet's shipped manager against a host cluster without
// Cilium's CRDs (lab.Options.WithoutCRDs): a missing optional API disables only what needs
// it (internal/optional). It has a lab of its own: the other end-to-end tests need Cilium.
//
// Run with: make test TEST_PKGS=./e2e/optionalcrds/ TEST_ARGS='-v'
package optionalcrds

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

var shared = lab.Shared{DirPrefix: "guestnet-e2e-optionalcrds", Options: lab.Options{WithoutCRDs: []string{"cilium"}}}

func TestMain(m *testing.M) { shared.Main(m) }

// cacheSyncTimeout is controller-runtime's default CacheSyncTimeout: a controller whose
// watch has not synced by then stops the whole manager.
const cacheSyncTimeout = 2 * time.Minute

// Without Cilium's CRDs the manager keeps running: GuestWebhookBridges are bridged, the
// GuestIngress says what to install and nothing is created for it; once the CRDs are
// installed, the same manager process builds the GuestIngress's chain.
func TestOptionalCRDs_WithoutCiliumOnlyTheGuestIngressWaits(t *testing.T) {
	g := NewWithT(t)
	l := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	host, guest := l.Host.Client, l.Guest.Client
	ns := "optional-" + utilrand.String(5)
	gc, err := l.CreateGuestCluster(ctx, ns, "guest", lab.WorkerTemplateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	m := l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})
	started := time.Now()

	// A GuestIngress and a GuestWebhookBridge of the same Cluster.
	guestNS := "contour-" + ns
	g.Expect(guest.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: guestNS}})).To(Succeed())
	envoy := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNS, Name: "envoy"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": "contour"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)},
			},
		},
	}
	g.Expect(guest.Create(ctx, envoy)).To(Succeed())
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  gc.Name,
			GuestService: guestnetv1.ObjectReference{Namespace: guestNS, Name: envoy.Name},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.98.140.10", L2: &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$"}}},
		},
	}
	g.Expect(host.Create(ctx, gi)).To(Succeed())
	bridge := func(name string, start int32) *guestnetv1.GuestWebhookBridge {
		webhookNS := name + "-" + ns
		wh, err := lab.CreateServiceWebhook(ctx, guest, l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = guest.Delete(context.Background(), wh.Config) })
		gwb := &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: guestnetv1.GuestWebhookBridgeSpec{
				ClusterName:        gc.Name,
				ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
				NodePortRange:      guestnetv1.NodePortRange{Start: start, Size: 1},
				Mode:               guestnetv1.BridgeModeAlways,
			},
		}
		g.Expect(host.Create(ctx, gwb)).To(Succeed())
		return gwb
	}
	eventuallyBridged := func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) {
		NewWithT(t).Eventually(func() bool {
			got := &guestnetv1.GuestWebhookBridge{}
			_ = host.Get(ctx, client.ObjectKeyFromObject(gwb), got)
			return conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "GuestWebhookBridge %s bridges its webhook", gwb.Name)
	}
	first := bridge("first", 30140)

	t.Run("bridge-works", func(t *testing.T) { eventuallyBridged(t, first) })

	t.Run("guestingress-says-what-to-install", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			got := &guestnetv1.GuestIngress{}
			g.Expect(host.Get(ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
			for _, typ := range []string{guestnetv1.ReadyCondition, guestnetv1.LoadBalancerReadyCondition} {
				c := conditions.Get(got, typ)
				g.Expect(c).NotTo(BeNil(), typ)
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse), typ)
				g.Expect(c.Reason).To(Equal(guestnetv1.CiliumLBIPAMNotInstalledReason), typ)
				g.Expect(c.Message).To(And(ContainSubstring("ciliumloadbalancerippools.cilium.io"), ContainSubstring("without a restart")), typ)
			}
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		// Nothing on the host, nothing changed in the guest.
		err := host.Get(ctx, client.ObjectKey{Namespace: ns, Name: hostnames.HostService(gi)}, &corev1.Service{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no host Service: %v", err)
		got := &corev1.Service{}
		g.Expect(guest.Get(ctx, client.ObjectKeyFromObject(envoy), got)).To(Succeed())
		g.Expect(got.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP), "the guest Service is left as it is")
	})

	// Past the time a watch that never syncs stops the manager: the process still runs, and
	// a bridge created now is bridged.
	time.Sleep(time.Until(started.Add(cacheSyncTimeout + 20*time.Second)))
	t.Run("manager-keeps-running", func(t *testing.T) {
		NewWithT(t).Expect(m.Exited()).To(BeFalse(), "the manager process ended")
		eventuallyBridged(t, bridge("second", 30141))
	})

	// Cilium installed now: the same process builds the chain.
	g.Expect(l.InstallThirdPartyCRDs("cilium")).To(Succeed())
	t.Run("cilium-picked-up-without-restart", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			got := &guestnetv1.GuestIngress{}
			g.Expect(host.Get(ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
			g.Expect(conditions.GetReason(got, guestnetv1.LoadBalancerReadyCondition)).NotTo(Equal(guestnetv1.CiliumLBIPAMNotInstalledReason))
			g.Expect(host.Get(ctx, client.ObjectKey{Name: hostnames.Pool(gi)}, ingress.NewPool())).To(Succeed(), "the pool exists")
			g.Expect(host.Get(ctx, client.ObjectKey{Name: hostnames.L2Policy(gi)}, ingress.NewL2Policy())).To(Succeed(), "the L2 policy exists")
			g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: hostnames.HostService(gi)}, &corev1.Service{})).To(Succeed(), "the host Service exists")
		}).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(Succeed())
		g.Expect(m.Exited()).To(BeFalse())
		g.Expect(m.Log()).To(ContainSubstring("Optional API installed"))
	})
}
