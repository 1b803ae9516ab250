package guestwebhookbridge_test

// Lab tests of the bridge's invariants in a world that does not cooperate (docs/
// guestwebhookbridge.md, "Invariants"): a record annotation removed or damaged by a user, a
// guest that goes away for good, a selection larger than status can hold, guest writes that
// must leave every field guestnet does not own alone, and a failing bridge that must not
// write at steady state. Same lab and environment as guestwebhookbridge_phases_lab_test.go.
//
// Run with: make test TEST_PKGS=./controllers/guestwebhookbridge/... TEST_ARGS='-run Invariants -v'

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestwebhookbridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/faultclient"
)

// A user (or a tool that prunes annotations) removes the record annotation from a bridged
// webhook configuration. The target must not look like "a url of someone else's": it stays
// bridged, its host Service stays, the annotation comes back from the bridge's host copy
// (status.records), and deleting the bridge still restores the chart's object exactly.
func TestGuestWebhookBridgeInvariants_ARemovedAnnotationIsRederived(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	original := e.getWebhookConfig(wh.Config.Name)
	gwb := e.createBridge("bridge", gc.Name)
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	g := e.g
	bridged := e.getWebhookConfig(wh.Config.Name)
	record := bridged.Annotations[guestnetv1.BridgeOriginalAnnotation]
	g.Expect(record).NotTo(BeEmpty())
	hostService := "tenant-a-" + e.webhookNS + "-cert-manager-webhook"

	e.removeRecordAnnotation(wh.Config.Name)
	g.Eventually(func() map[string]string { return e.getWebhookConfig(wh.Config.Name).Annotations }).WithTimeout(waitTimeout).
		Should(HaveKeyWithValue(guestnetv1.BridgeOriginalAnnotation, record), "the record comes back from the host copy")
	g.Consistently(func(g Gomega) {
		cc := e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig
		g.Expect(cc.URL).To(Equal(bridged.Webhooks[0].ClientConfig.URL))
		_, err := e.tryGetHostService(hostService)
		g.Expect(err).NotTo(HaveOccurred(), "the host Service the webhook calls stays")
	}).WithTimeout(3 * time.Second).Should(Succeed())
	got := e.getBridge(gwb)
	g.Expect(got.Status.Targets).To(HaveLen(1))
	g.Expect(got.Status.Targets[0].Bridged).To(BeTrue())
	g.Expect(got.Status.Targets[0].HostService).To(Equal(hostService))
	e.expectEvent(gwb, "Repaired", "from the bridge's host copy")

	// Removed again, and the bridge deleted before it re-derives it: the restore reads the
	// host copy.
	e.removeRecordAnnotation(wh.Config.Name)
	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)
	restored := e.getWebhookConfig(wh.Config.Name)
	g.Expect(jsonOf(restored.Webhooks)).To(MatchJSON(jsonOf(original.Webhooks)))
	g.Expect(restored.Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
}

// A record annotation that is not guestnet's JSON any more damages one target, not the
// bridge: the webhook's record is re-derived from the host copy while the APIService of the
// same bridge stays bridged, and deleting the bridge restores both.
func TestGuestWebhookBridgeInvariants_ACorruptRecordFailsOnlyItsOwnTarget(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	wh := e.createWebhook()
	api := e.createMetricsAPI()
	gc := e.createCluster("tenant-a", 1)
	originalWebhooks := e.getWebhookConfig(wh.Config.Name)
	originalAPIService := e.getAPIService(api.APIService.Name)
	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.APIServices = &guestnetv1.TargetSelector{Names: []string{api.APIService.Name}}
	})
	e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue())
		g.Expect(got.Status.BridgedTargets).To(BeEquivalentTo(2))
	})
	g := e.g
	record := e.getWebhookConfig(wh.Config.Name).Annotations[guestnetv1.BridgeOriginalAnnotation]

	e.setRecordAnnotation(wh.Config.Name, `{"webhook.cert-manager.io": "edited by hand`)
	g.Eventually(func() string {
		return e.getWebhookConfig(wh.Config.Name).Annotations[guestnetv1.BridgeOriginalAnnotation]
	}).
		WithTimeout(waitTimeout).Should(Equal(record), "re-derived from the host copy")
	got := e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	g.Expect(got.Status.BridgedTargets).To(BeEquivalentTo(2))

	// Damaged again, then the bridge is deleted: both targets are restored.
	e.setRecordAnnotation(wh.Config.Name, `not json`)
	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)
	restored := e.getWebhookConfig(wh.Config.Name)
	g.Expect(jsonOf(restored.Webhooks)).To(MatchJSON(jsonOf(originalWebhooks.Webhooks)))
	g.Expect(restored.Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
	g.Expect(jsonOf(e.getAPIService(api.APIService.Name).Spec)).To(MatchJSON(jsonOf(originalAPIService.Spec)))
}

// The guest becomes unreachable after the bridge rewrote it, then the bridge is deleted: it
// waits (the originals exist only in the guest) until the guest is gone for good, here its
// <cluster>-kubeconfig Secret deleted. Then it cleans the host side, releases its finalizer
// and says in an event what it left in the guest.
func TestGuestWebhookBridgeInvariants_AGoneGuestReleasesTheFinalizer(t *testing.T) {
	t.Parallel()
	e, gwb, path := e2eUnreachableGuest(t)
	g := e.g

	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	g.Consistently(func() error {
		return e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), &guestnetv1.GuestWebhookBridge{})
	}).
		WithTimeout(3*time.Second).Should(Succeed(), "the deletion waits while the guest may come back")
	g.Expect(e.host.Delete(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "tenant-a-kubeconfig"}})).To(Succeed())
	e.eventuallyGone(gwb)
	e.expectEvent(gwb, guestnetv1.GuestGoneReason, "Secret "+e.ns+"/tenant-a-kubeconfig")
	e.expectEvent(gwb, guestnetv1.GuestGoneReason, "ValidatingWebhookConfiguration "+e.webhookNS+", webhook "+lab.WebhookName)
	e.expectNoHostServices()
	path.close()
	// Nothing could be restored: the guest keeps the bridge's url and record (the runbook's
	// bridge-gone section tells how to clean it up).
	g.Expect(e.getWebhookConfig(e.webhookNS).Annotations).To(HaveKey(guestnetv1.BridgeOriginalAnnotation))
}

// An admin gives up on an unreachable guest with the skip-guest-cleanup annotation: the
// bridge cleans the host side, releases its finalizer and says what it left in the guest.
// The record it left there claims nothing: once the guest is back, a new bridge takes the
// target over and, deleted, restores the chart's original.
func TestGuestWebhookBridgeInvariants_SkipGuestCleanupGivesUpCleanly(t *testing.T) {
	t.Parallel()
	e, gwb, path := e2eUnreachableGuest(t)
	defer path.close()
	g := e.g
	chart := e.chartWebhooks

	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	g.Consistently(func() error {
		return e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), &guestnetv1.GuestWebhookBridge{})
	}).
		WithTimeout(3*time.Second).Should(Succeed(), "the deletion waits while the guest may come back")
	e.updateBridge(gwb, func(b *guestnetv1.GuestWebhookBridge) {
		b.Annotations = map[string]string{guestnetv1.SkipGuestCleanupAnnotation: "true"}
	})
	e.eventuallyGone(gwb)
	e.expectEvent(gwb, "GuestCleanupSkipped", "ValidatingWebhookConfiguration "+e.webhookNS+", webhook "+lab.WebhookName)
	e.expectNoHostServices()
	g.Expect(e.getWebhookConfig(e.webhookNS).Annotations[guestnetv1.BridgeOriginalAnnotation]).To(ContainSubstring(e.ns+"/bridge"), "left in the guest")

	// The guest is back (direct, no more through the closed path).
	e.setControlPlaneEndpoint("tenant-a", lab.GuestControlPlaneEndpoint())
	secret := &corev1.Secret{}
	g.Expect(e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a-kubeconfig"}, secret)).To(Succeed())
	secret.Data["value"] = e.l.Guest.Kubeconfig
	g.Expect(e.host.Update(e.ctx, secret)).To(Succeed())
	successor := e.createBridge("successor", "tenant-a")
	// The ClusterCache drops the dead connection after its health checks fail (up to a
	// minute), then connects with the Secret as it is now.
	g.Eventually(func(g Gomega) {
		got := e.getBridge(successor)
		g.Expect(conditions.GetReason(got, guestnetv1.TargetsBridgedCondition)).To(Equal(guestnetv1.TargetsBridgedReason))
	}).WithTimeout(3 * time.Minute).WithPolling(poll).Should(Succeed())
	g.Expect(e.getWebhookConfig(e.webhookNS).Annotations[guestnetv1.BridgeOriginalAnnotation]).To(ContainSubstring(e.ns + "/successor"))
	e.expectEvent(successor, "Repaired", "Took over ValidatingWebhookConfiguration "+e.webhookNS)
	g.Expect(e.host.Delete(e.ctx, successor)).To(Succeed())
	e.eventuallyGone(successor)
	g.Expect(jsonOf(e.getWebhookConfig(e.webhookNS).Webhooks)).To(MatchJSON(jsonOf(chart)))
	g.Expect(e.getWebhookConfig(e.webhookNS).Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
}

// A selection larger than status can hold (all webhook configurations of a label, 257
// targets): guestnet bridges the first 256, leaves the others untouched, says which it left
// out, and its status patch is accepted.
func TestGuestWebhookBridgeInvariants_TooManyTargetsAreBounded(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	g := e.g
	label := map[string]string{"guestnet-test": e.ns}
	var names []string
	for i := range guestnetv1.MaxTargets + 1 {
		cfg := e.webhookConfig(fmt.Sprintf("%s-%03d", e.webhookNS, i), *wh.Config.Webhooks[0].ClientConfig.DeepCopy())
		cfg.Labels = label
		g.Expect(e.guest.Create(e.ctx, cfg)).To(Succeed())
		names = append(names, cfg.Name)
		e.t.Cleanup(func() { _ = e.guest.Delete(context.Background(), cfg) })
	}
	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.ValidatingWebhooks = &guestnetv1.TargetSelector{Selector: &guestnetv1.TargetLabelSelector{
			MatchLabels: map[string]guestnetv1.LabelValue{"guestnet-test": guestnetv1.LabelValue(e.ns)}}}
	})

	got := e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.GetReason(got, guestnetv1.TargetsBridgedCondition)).To(Equal(guestnetv1.TooManyTargetsReason))
		g.Expect(got.Status.Targets).To(HaveLen(guestnetv1.MaxTargets))
	})
	g.Expect(got.Status.TotalTargets).To(BeEquivalentTo(guestnetv1.MaxTargets + 1))
	msg := conditions.GetMessage(got, guestnetv1.TargetsBridgedCondition)
	g.Expect(msg).To(ContainSubstring("257 targets match the selection; guestnet handles at most 256"))
	g.Expect(msg).To(ContainSubstring("left out: ValidatingWebhookConfiguration " + names[256]))
	g.Expect(conditions.IsFalse(got, guestnetv1.ReadyCondition)).To(BeTrue())
	g.Eventually(func() *string { return e.getWebhookConfig(names[255]).Webhooks[0].ClientConfig.URL }).WithTimeout(waitTimeout).ShouldNot(BeNil())
	g.Expect(e.getWebhookConfig(names[256]).Webhooks[0].ClientConfig.Service).NotTo(BeNil(), "left out: untouched")
}

// Guest writes touch only guestnet's fields. A guest apiserver of the same version as
// guestnet's typed structs (the lab's 1.37.2) cannot hold a field those structs lack: it
// decodes every object into the same types. A newer guest can (matchConditions was such a
// field for clients older than 1.27). What a newer guest would lose is what a write sends
// without meaning to: a full Update sends every field of the typed struct, so every field it
// lacks is dropped. So this test checks, on the real apiserver, what guestnet sends: every
// write to the webhook configuration is a JSON patch whose operations name only the webhook's
// clientConfig.url and clientConfig.service, the record annotation and the resourceVersion
// guestnet read; the other managers (the chart's "helm", "cert-manager-cainjector") keep their
// fields; and after rewrite and restore the object is, field for field, the chart's. The
// unit test TestGuestPatchKeepsUnknownFields applies the same patches to an object that does
// carry fields v0.37 does not know, with the apiserver's JSON patch library.
func TestGuestWebhookBridgeInvariants_GuestWritesTouchOnlyGuestnetFields(t *testing.T) {
	t.Parallel()
	e := newBridgeEnvWithoutManager(t)
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	g := e.g
	// The chart's fields belong to "helm" (server-side apply), the caBundle to cainjector.
	chart := e.getWebhookConfig(wh.Config.Name)
	chart.ManagedFields, chart.ResourceVersion, chart.UID, chart.CreationTimestamp, chart.Generation = nil, "", "", metav1.Time{}, 0
	chart.APIVersion, chart.Kind = "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"
	chart.Webhooks[0].MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "not-kube-system", Expression: "request.namespace != 'kube-system'"}}
	chart.Webhooks[0].ClientConfig.CABundle = nil
	g.Expect(e.guest.Patch(e.ctx, chart, client.RawPatch(types.ApplyPatchType, []byte(jsonOf(chart))),
		client.FieldOwner("helm"), client.ForceOwnership)).To(Succeed())
	e.injectCABundle(wh.Config.Name, e.l.Guest.CA.CertPEM())
	before := e.getWebhookConfig(wh.Config.Name)
	managersBefore := managers(before)

	writes := &guestWrites{}
	stop := e.runManagerWith(faultclient.NewBudget(-1, nil), writes, nil)
	defer func() { _ = stop() }()
	gwb := e.createBridge("bridge", gc.Name)
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	bridged := e.getWebhookConfig(wh.Config.Name)
	g.Expect(bridged.Webhooks[0].MatchConditions).To(Equal(before.Webhooks[0].MatchConditions))
	// Every manager keeps what it had, except the service reference guestnet removed; guestnet
	// owns only what it wrote.
	g.Expect(managers(bridged)).To(HaveKeyWithValue("cert-manager-cainjector", managersBefore["cert-manager-cainjector"]))
	g.Expect(managers(bridged)["guestnet"]).To(MatchJSON(`{"f:metadata":{"f:annotations":{".":{},"f:` + guestnetv1.BridgeOriginalAnnotation + `":{}}},` +
		`"f:webhooks":{"k:{\"name\":\"` + lab.WebhookName + `\"}":{"f:clientConfig":{"f:url":{}}}}}`))

	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)
	restored := e.getWebhookConfig(wh.Config.Name)
	g.Expect(jsonOf(restored.Webhooks)).To(MatchJSON(jsonOf(before.Webhooks)))
	g.Expect(restored.Labels).To(Equal(before.Labels))
	g.Expect(restored.Annotations).To(Equal(before.Annotations))
	g.Expect(managers(restored)).To(HaveKeyWithValue("cert-manager-cainjector", managersBefore["cert-manager-cainjector"]))

	recorded := writes.to("ValidatingWebhookConfiguration", wh.Config.Name)
	g.Expect(recorded).To(HaveLen(2), "one rewrite, one restore")
	for _, w := range recorded {
		g.Expect(w.verb).To(Equal("patch"))
		g.Expect(w.patchType).To(Equal(types.JSONPatchType))
		var ops []struct {
			Op    string          `json:"op"`
			Path  string          `json:"path"`
			Value json.RawMessage `json:"value"`
		}
		g.Expect(json.Unmarshal(w.data, &ops)).To(Succeed())
		for _, op := range ops {
			if op.Path == "/metadata/annotations" {
				// The object had no annotation: the map is added with the record alone, and
				// removed with it.
				g.Expect(op.Op).To(BeElementOf("add", "remove"))
				if op.Op == "add" {
					var value map[string]string
					g.Expect(json.Unmarshal(op.Value, &value)).To(Succeed())
					g.Expect(value).To(HaveLen(1))
					g.Expect(value).To(HaveKey(guestnetv1.BridgeOriginalAnnotation))
				}
				continue
			}
			g.Expect(op.Path).To(BeElementOf(
				"/metadata/resourceVersion",
				"/metadata/annotations/"+strings.ReplaceAll(guestnetv1.BridgeOriginalAnnotation, "/", "~1"),
				"/webhooks/0/clientConfig/url",
				"/webhooks/0/clientConfig/service",
			), "patch %s", w.data)
		}
	}
}

// A bridge whose target serves an expired certificate is TLSUnverified, with a message that
// does not carry the time of the probe, and then writes nothing and probes nothing while
// nothing changes: no write for longer than the old 10 s retry twice over. Changing the
// recheck annotation probes again at once.
func TestGuestWebhookBridgeInvariants_AFailingBridgeWritesNothingAtSteadyState(t *testing.T) {
	t.Parallel()
	e := newBridgeEnvWithoutManager(t)
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	g := e.g
	budget := faultclient.NewBudget(-1, nil)
	probes := &probeCounter{}
	stop := e.runManagerWith(budget, nil, probes.probe)
	defer func() { _ = stop() }()
	gwb := e.createBridge("bridge", gc.Name)
	hostService := "tenant-a-" + e.webhookNS + "-cert-manager-webhook"
	g.Eventually(func() error { _, err := e.tryGetHostService(hostService); return err }).WithTimeout(waitTimeout).Should(Succeed())

	// The webhook "answers" at the host Service's ClusterIP (local in the lab's namespace)
	// with a certificate signed by its caBundle's CA that expired an hour ago.
	svc := e.getHostService(hostService)
	e.serveExpiredCertificate(net.JoinHostPort(svc.Spec.ClusterIP, "443"), hostService+"."+e.ns+".svc", wh.Config.Webhooks[0].ClientConfig.CABundle)
	e.updateBridge(gwb, func(b *guestnetv1.GuestWebhookBridge) {
		b.Annotations = map[string]string{guestnetv1.RecheckAnnotation: "1"}
	})
	got := e.eventuallyCondition(gwb, guestnetv1.TargetsReachableCondition, metav1.ConditionFalse, guestnetv1.TLSUnverifiedReason)
	msg := conditions.GetMessage(got, guestnetv1.TargetsReachableCondition)
	g.Expect(msg).To(ContainSubstring("certificate expired at"))
	g.Expect(msg).NotTo(ContainSubstring("current time"))

	// Let the status settle, then nothing may be written or probed.
	var writes, probed int
	g.Eventually(func() bool {
		w, p := len(budget.Writes), probes.count()
		settled := w == writes && p == probed
		writes, probed = w, p
		return settled
	}).WithTimeout(waitTimeout).WithPolling(3 * time.Second).Should(BeTrue())
	g.Consistently(func() []string { return budget.Writes[writes:] }).WithTimeout(25*time.Second).WithPolling(time.Second).Should(BeEmpty(),
		"a failing bridge writes nothing while nothing changes")
	g.Expect(probes.count()).To(Equal(probed), "no probe while its inputs are unchanged")

	e.updateBridge(gwb, func(b *guestnetv1.GuestWebhookBridge) { b.Annotations[guestnetv1.RecheckAnnotation] = "2" })
	g.Eventually(probes.count).WithTimeout(waitTimeout).Should(BeNumerically(">", probed), "the recheck annotation probes again")
}

// --- helpers ------------------------------------------------------------------------------

// e2eUnreachableGuest is a bridged webhook whose guest becomes unreachable: guestnet reaches
// the guest apiserver through a TCP path of the test's (its kubeconfig Secret points there),
// which is closed once the webhook is bridged.
func e2eUnreachableGuest(t *testing.T) (*bridgeEnv, *guestnetv1.GuestWebhookBridge, *tcpPath) {
	e := newBridgeEnvWithoutManager(t)
	e.createWebhook()
	e.chartWebhooks = e.getWebhookConfig(e.webhookNS).Webhooks
	gc := e.createCluster("tenant-a", 1)
	path := e.routeGuestThroughPath(gc.Name)
	t.Cleanup(path.close)
	lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupGuestWebhookBridge)
	gwb := e.createBridge("bridge", gc.Name)
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	e.g.Expect(e.getWebhookConfig(e.webhookNS).Webhooks[0].ClientConfig.URL).NotTo(BeNil())
	path.close()
	return e, gwb, path
}

// tcpPath forwards connections from a local address to the guest apiserver until closed;
// closing also cuts the connections it carries.
type tcpPath struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	once  sync.Once
}

func (p *tcpPath) close() {
	p.once.Do(func() {
		_ = p.l.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
}

// routeGuestThroughPath points the cluster's control plane endpoint and kubeconfig Secret at
// a tcpPath to the guest apiserver, on another port of the guest apiserver's address (the
// certificate is still verified for the apiserver's own name).
func (e *bridgeEnv) routeGuestThroughPath(cluster string) *tcpPath {
	e.t.Helper()
	g := e.g
	server, err := url.Parse(e.l.Guest.Server())
	g.Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", net.JoinHostPort(lab.GuestAPIServerAddress, "0"))
	g.Expect(err).NotTo(HaveOccurred())
	e.setControlPlaneEndpoint(cluster, clusterv1.APIEndpoint{Host: lab.GuestAPIServerAddress, Port: int32(l.Addr().(*net.TCPAddr).Port)})
	p := &tcpPath{l: l}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", server.Host)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _ = copyConn(out, in) }()
			go func() { _ = copyConn(in, out) }()
		}
	}()

	cfg, err := clientcmd.Load(e.l.Guest.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	for _, c := range cfg.Clusters {
		c.TLSServerName = server.Hostname()
		c.Server = "https://" + l.Addr().String()
	}
	kubeconfig, err := clientcmd.Write(*cfg)
	g.Expect(err).NotTo(HaveOccurred())
	secret := &corev1.Secret{}
	g.Expect(e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: cluster + "-kubeconfig"}, secret)).To(Succeed())
	secret.Data["value"] = kubeconfig
	g.Expect(e.host.Update(e.ctx, secret)).To(Succeed())
	return p
}

// setControlPlaneEndpoint sets the Cluster's spec.controlPlaneEndpoint: guestnet connects
// only to it, whatever the kubeconfig Secret says.
func (e *bridgeEnv) setControlPlaneEndpoint(cluster string, endpoint clusterv1.APIEndpoint) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &clusterv1.Cluster{}
		if err := e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: cluster}, c); err != nil {
			return err
		}
		c.Spec.ControlPlaneEndpoint = endpoint
		return e.host.Update(e.ctx, c)
	})).To(Succeed())
}

func copyConn(dst, src net.Conn) error {
	defer dst.Close()
	buf := make([]byte, 32*1024)
	for {
		r, err := src.Read(buf)
		if r > 0 {
			if _, werr := dst.Write(buf[:r]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err
		}
	}
}

// runManagerWith starts a manager for the test's namespace whose bridge controller writes
// through budget (host and guest), records its guest writes in writes (when set) and probes
// with probe (bridge.Probe when nil).
func (e *bridgeEnv) runManagerWith(budget *faultclient.Budget, writes *guestWrites,
	probe func(ctx context.Context, addr, serverName string, caBundle []byte, insecure bool) bridge.ProbeResult) func() error {
	e.t.Helper()
	setup := func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, _ manager.Options) error {
		return (&guestwebhookbridge.Reconciler{
			Client:       faultclient.Wrap(mgr.GetClient(), budget),
			APIReader:    mgr.GetAPIReader(),
			ClusterCache: &faultClusterCache{ClusterCache: cc, budget: budget, writes: writes},
			Probe:        probe,
		}).SetupWithManager(ctx, mgr, controller.Options{})
	}
	_, stop, err := lab.RunManager(context.Background(), e.l, manager.Options{WatchNamespace: e.ns}, setup, logr.Discard())
	e.g.Expect(err).NotTo(HaveOccurred())
	return stop
}

// faultClusterCache hands out guest clients whose writes go through the budget (and are
// recorded in writes, when set).
type faultClusterCache struct {
	clustercache.ClusterCache
	budget *faultclient.Budget
	writes *guestWrites
}

func (c *faultClusterCache) wrap(cl client.Client) client.Client {
	if c.writes != nil {
		cl = &recordingClient{Client: cl, writes: c.writes}
	}
	return faultclient.Wrap(cl, c.budget)
}

func (c *faultClusterCache) GetClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	cl, err := c.ClusterCache.GetClient(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return c.wrap(cl), nil
}

func (c *faultClusterCache) GetUncachedClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	cl, err := c.ClusterCache.GetUncachedClient(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return c.wrap(cl), nil
}

// guestWrites records the writes to guest objects: verb, kind, name and, for patches, the
// patch type and body.
type guestWrites struct {
	mu  sync.Mutex
	all []guestWrite
}

type guestWrite struct {
	verb, kind, name string
	patchType        types.PatchType
	data             []byte
}

func (w *guestWrites) add(gw guestWrite) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all = append(w.all, gw)
}

func (w *guestWrites) to(kind, name string) []guestWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []guestWrite
	for _, gw := range w.all {
		if gw.kind == kind && gw.name == name {
			out = append(out, gw)
		}
	}
	return out
}

type recordingClient struct {
	client.Client
	writes *guestWrites
}

func kindOf(c client.Client, obj client.Object) string {
	gvk, err := c.GroupVersionKindFor(obj)
	if err != nil {
		return fmt.Sprintf("%T", obj)
	}
	return gvk.Kind
}

func (c *recordingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.writes.add(guestWrite{verb: "update", kind: kindOf(c.Client, obj), name: obj.GetName()})
	return c.Client.Update(ctx, obj, opts...)
}

func (c *recordingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	c.writes.add(guestWrite{verb: "patch", kind: kindOf(c.Client, obj), name: obj.GetName(), patchType: patch.Type(), data: data})
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// probeCounter counts the probes of a bridge and runs the real one.
type probeCounter struct {
	mu sync.Mutex
	n  int
}

func (p *probeCounter) probe(ctx context.Context, addr, serverName string, caBundle []byte, insecure bool) bridge.ProbeResult {
	p.mu.Lock()
	p.n++
	p.mu.Unlock()
	return bridge.Probe(ctx, addr, serverName, caBundle, insecure)
}

func (p *probeCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// managers is each field manager's managed fields of obj, as JSON.
func managers(obj metav1.Object) map[string]string {
	out := map[string]string{}
	for _, m := range obj.GetManagedFields() {
		if m.FieldsV1 != nil {
			out[m.Manager] = m.FieldsV1.GetRawString()
		}
	}
	return out
}

func (e *bridgeEnv) removeRecordAnnotation(config string) {
	e.t.Helper()
	patch := `[{"op": "remove", "path": "/metadata/annotations/` + strings.ReplaceAll(guestnetv1.BridgeOriginalAnnotation, "/", "~1") + `"}]`
	e.g.Expect(e.guest.Patch(e.ctx, e.getWebhookConfig(config), client.RawPatch(types.JSONPatchType, []byte(patch)), client.FieldOwner("kubectl-annotate"))).To(Succeed())
}

func (e *bridgeEnv) setRecordAnnotation(config, value string) {
	e.t.Helper()
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{guestnetv1.BridgeOriginalAnnotation: value}}}
	e.g.Expect(e.guest.Patch(e.ctx, e.getWebhookConfig(config), client.RawPatch(types.MergePatchType, []byte(jsonOf(patch))), client.FieldOwner("kubectl-edit"))).To(Succeed())
}

func (e *bridgeEnv) expectNoHostServices() {
	e.t.Helper()
	e.g.Eventually(func(g Gomega) []string {
		list := &corev1.ServiceList{}
		g.Expect(e.host.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
		var names []string
		for _, s := range list.Items {
			names = append(names, s.Name)
		}
		return names
	}).WithTimeout(waitTimeout).Should(BeEmpty())
}

// serveExpiredCertificate serves TLS at addr with a certificate for name, signed by the CA
// in caBundle (the lab's guest CA), that expired an hour ago.
func (e *bridgeEnv) serveExpiredCertificate(addr, name string, caBundle []byte) {
	e.t.Helper()
	g := e.g
	ca := e.l.Guest.CA
	g.Expect(caBundle).To(Equal(ca.CertPEM()))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	g.Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-48 * time.Hour),
		NotAfter:     time.Now().Add(-time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	g.Expect(err).NotTo(HaveOccurred())
	l, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12})
	g.Expect(err).NotTo(HaveOccurred())
	e.t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
}
