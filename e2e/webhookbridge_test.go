package e2e

// The GuestWebhookBridge end to end, with the real servers users run in their guests
// (cert-manager's webhook and cainjector, metrics-server, see thirdparty_test.go) and the
// real guest apiserver calling them through the whole chain: <host Service>.<ns>.svc (DNS
// stand-in) -> host ClusterIP (kube-proxy stand-in) -> virt-launcher EndpointSlice (real
// kube-controller-manager) -> worker pod IP:nodePort (masquerade stand-in, declared ports
// only) -> guest NodePort (guest kube-proxy stand-in) -> the server's pod.
//
// The steps share the cluster-wide third-party objects and run in order in one test; the
// bridge is deleted at the end and the chart's objects must be back as they were.

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

func TestWebhookBridge_CertManagerAndMetricsServerWorkThroughTheBridge(t *testing.T) {
	g := NewWithT(t)
	l, tp := startThirdParty(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	guest, host := l.Guest.Client, l.Host.Client
	cm, ns := tp.CertManager, tp.Cluster.Namespace
	const timeout = 60 * time.Second

	startCiliumStandIn(t, l)
	kp, err := lab.StartGuestKubeProxyStandIn(ctx, l)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kp.Stop)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	chartValidating := getValidating(ctx, g, guest)
	chartMutating := getMutating(ctx, g, guest)
	chartAPIService := getAPIService(ctx, g, guest)

	// Before: the field report's failures, with the real servers.
	g.Expect(createClusterIssuer(ctx, guest, "before")).To(MatchError(ContainSubstring(`failed calling webhook "` + lab.WebhookName + `"`)))
	g.Eventually(func() apiregistrationv1.ConditionStatus { return metricsAvailable(ctx, g, guest).Status }).
		WithTimeout(timeout).Should(Equal(apiregistrationv1.ConditionFalse))

	// The bridge, in mode Auto (the default): the guest has no konnectivity agents, so every
	// target is bridged.
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        tp.Cluster.Name,
			APIServices:        &guestnetv1.TargetSelector{Names: []string{lab.MetricsAPIServiceName}},
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{lab.CertManagerWebhookName}},
			MutatingWebhooks:   &guestnetv1.TargetSelector{Names: []string{lab.CertManagerWebhookName}},
		},
	}
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = host.Delete(context.Background(), gwb)
		}
	})
	hostService := tp.Cluster.Name + "-" + lab.CertManagerNamespace + "-" + lab.CertManagerWebhookName
	serverName := hostService + "." + ns + ".svc"

	// cert-manager's serving certificate carries its Service names only: the bridge says
	// which name is missing and how to add it.
	status := eventuallyBridge(ctx, g, host, gwb, timeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue(), "%v", conditions.Get(got, guestnetv1.TargetsBridgedCondition))
		g.Expect(conditions.GetReason(got, guestnetv1.TargetsReachableCondition)).To(Equal(guestnetv1.TLSNameMismatchReason))
		// Conditions and the rest of status are two patches: wait for both.
		g.Expect(got.Status.BridgedTargets).To(BeEquivalentTo(3))
	})
	// Both copies of every record: the guest objects' annotations and the bridge's status.
	g.Expect(status.Status.Records).To(HaveLen(3))
	g.Expect(getValidating(ctx, g, guest).Annotations).To(HaveKey(guestnetv1.BridgeOriginalAnnotation))
	msg := conditions.GetMessage(status, guestnetv1.TargetsReachableCondition)
	g.Expect(msg).To(ContainSubstring("2 of 3 bridged targets cannot be called"))
	g.Expect(msg).To(ContainSubstring("not " + serverName + ", the name the guest apiserver verifies"))
	g.Expect(msg).To(ContainSubstring("webhook.url.host=" + serverName))
	t.Logf("TargetsReachable: %s", msg)
	// The guest apiserver agrees: it reaches the webhook and rejects its certificate.
	g.Eventually(func() error { return createClusterIssuer(ctx, guest, "mismatch") }).WithTimeout(timeout).
		Should(MatchError(And(ContainSubstring("failed calling webhook"), ContainSubstring("x509"))))

	// The user does what the condition says (cert-manager's --dynamic-serving-dns-names, which
	// the chart value webhook.url.host also sets), and asks for a new probe with the recheck
	// annotation, as the docs say (a restarted server changes nothing the bridge watches).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cm.SetWebhookDNSNames(ctx, l); err != nil {
			t.Errorf("restoring the webhook's DNS names: %v", err)
		}
	})
	g.Expect(cm.SetWebhookDNSNames(ctx, l, serverName)).To(Succeed())
	recheck := []byte(`{"metadata":{"annotations":{"` + guestnetv1.RecheckAnnotation + `":"1"}}}`)
	g.Expect(host.Patch(ctx, gwb, client.RawPatch(types.MergePatchType, recheck))).To(Succeed())
	eventuallyBridge(ctx, g, host, gwb, timeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue(), "%v", got.Status.Conditions)
	})

	// After: cert-manager's webhook really runs for the guest apiserver.
	t.Run("cert-manager admits a ClusterIssuer and its own validation rejects an invalid one", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func() error { return createClusterIssuer(ctx, guest, "after") }).WithTimeout(timeout).Should(Succeed())
		err := guest.Create(ctx, clusterIssuer(uniqueName("invalid"), map[string]any{}))
		g.Expect(err).To(MatchError(ContainSubstring(`admission webhook "` + lab.WebhookName + `" denied the request`)))
		g.Expect(err).To(MatchError(ContainSubstring("at least one issuer must be configured")))
	})

	t.Run("the metrics API is Available and answers through the guest apiserver", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func() apiregistrationv1.ConditionStatus { return metricsAvailable(ctx, g, guest).Status }).
			WithTimeout(timeout).Should(Equal(apiregistrationv1.ConditionTrue))
		clientset, err := kubernetes.NewForConfig(l.Guest.Config)
		g.Expect(err).NotTo(HaveOccurred())
		var nodes metricsList
		g.Eventually(func(g Gomega) {
			body, err := clientset.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/nodes").DoRaw(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			nodes = metricsList{}
			g.Expect(json.Unmarshal(body, &nodes)).To(Succeed())
			g.Expect(nodes.byName()).To(HaveKey(tp.Workers[0].Machine))
		}).WithTimeout(90 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
		want := tp.Usage[tp.Workers[0].Machine]
		got := nodes.byName()[tp.Workers[0].Machine]
		g.Expect(got.Usage.Memory().Value()).To(Equal(want.MemoryBytes))
		t.Logf("kubectl top node %s through the guest apiserver: cpu=%s memory=%s", tp.Workers[0].Machine, got.Usage.Cpu(), got.Usage.Memory())
	})

	t.Run("a Helm-style revert of the webhook configuration is repaired", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			chart := chartValidating.DeepCopy()
			live := getValidating(ctx, g, guest)
			chart.ResourceVersion = live.ResourceVersion
			chart.ManagedFields = nil
			// The chart does not know the CA cainjector injects: keep the live one, as
			// cainjector would put it back at once.
			for i := range chart.Webhooks {
				chart.Webhooks[i].ClientConfig.CABundle = live.Webhooks[i].ClientConfig.CABundle
			}
			return guest.Update(ctx, chart, client.FieldOwner("helm"))
		})).To(Succeed())
		reverted := time.Now()
		g.Eventually(func() bool { return getValidating(ctx, g, guest).Webhooks[0].ClientConfig.URL != nil }).
			WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(BeTrue())
		t.Logf("repaired %s after the revert", time.Since(reverted).Round(time.Millisecond))
		g.Eventually(func() error { return createClusterIssuer(ctx, guest, "repaired") }).WithTimeout(timeout).Should(Succeed())
	})

	t.Run("cainjector rotating the CA does not break the bridge", func(t *testing.T) {
		g := NewWithT(t)
		oldBundle, newBundle, err := cm.RotateCA(ctx, guest)
		g.Expect(err).NotTo(HaveOccurred())
		t.Logf("webhook restarts for cert-manager's stale serving certificate so far: %d", cm.StaleLeafRestarts())
		g.Expect(newBundle).NotTo(Equal(oldBundle))
		live := getValidating(ctx, g, guest)
		g.Expect(live.Webhooks[0].ClientConfig.CABundle).To(Equal(newBundle))
		g.Expect(live.Webhooks[0].ClientConfig.URL).NotTo(BeNil(), "cainjector leaves the url alone")
		g.Eventually(func() error { return createClusterIssuer(ctx, guest, "rotated") }).WithTimeout(timeout).Should(Succeed())
		g.Consistently(func() []byte { return getValidating(ctx, g, guest).Webhooks[0].ClientConfig.CABundle }).
			WithTimeout(2*time.Second).Should(Equal(newBundle), "guestnet does not fight cainjector")
	})

	t.Run("a worker going away does not break the bridge while another is up", func(t *testing.T) {
		g := NewWithT(t)
		extra, err := l.AddWorker(ctx, tp.Cluster, ns+"-md-0-extra", "10.244.1.233")
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func() []string { return readyEndpointAddresses(t, l, ns, hostService) }).WithTimeout(timeout).
			Should(ConsistOf(tp.Workers[0].IP, tp.Workers[1].IP, extra.IP))
		g.Expect(l.RemoveWorker(ctx, tp.Cluster, extra)).To(Succeed())
		g.Eventually(func() []string { return readyEndpointAddresses(t, l, ns, hostService) }).WithTimeout(timeout).
			Should(ConsistOf(tp.Workers[0].IP, tp.Workers[1].IP))
		// Round robin over the remaining workers: every call works.
		for i := range 4 {
			g.Expect(createClusterIssuer(ctx, guest, fmt.Sprintf("after-worker-%d", i))).To(Succeed())
		}
	})

	t.Run("deleting the bridge restores the exact originals", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(host.Delete(ctx, gwb)).To(Succeed())
		deleted = true
		g.Eventually(func() bool {
			return apierrors.IsNotFound(host.Get(ctx, client.ObjectKeyFromObject(gwb), &guestnetv1.GuestWebhookBridge{}))
		}).WithTimeout(timeout).Should(BeTrue(), "the finalizer goes once the originals are back")

		bundle, err := cm.InjectedCABundle(ctx, guest)
		g.Expect(err).NotTo(HaveOccurred())
		for _, pair := range []struct{ live, chart any }{
			{getValidating(ctx, g, guest), chartValidating},
			{getMutating(ctx, g, guest), chartMutating},
		} {
			g.Expect(webhooksJSON(pair.live, nil)).To(MatchJSON(webhooksJSON(pair.chart, bundle)), "as the chart made them, with the CA cainjector injects now")
		}
		g.Expect(getValidating(ctx, g, guest).Annotations).To(Equal(chartValidating.Annotations))
		g.Expect(jsonString(getAPIService(ctx, g, guest).Spec)).To(MatchJSON(jsonString(chartAPIService.Spec)))
		g.Eventually(func() error { return createClusterIssuer(ctx, guest, "restored") }).WithTimeout(timeout).
			Should(MatchError(ContainSubstring("failed calling webhook")), "without the bridge, the field report's failure is back")
	})
}

// --- helpers ------------------------------------------------------------------------------

func createClusterIssuer(ctx context.Context, guest client.Client, prefix string) error {
	return guest.Create(ctx, clusterIssuer(uniqueName(prefix), map[string]any{"selfSigned": map[string]any{}}))
}

func getValidating(ctx context.Context, g Gomega, c client.Client) *admissionregistrationv1.ValidatingWebhookConfiguration {
	got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: lab.CertManagerWebhookName}, got)).To(Succeed())
	return got
}

func getMutating(ctx context.Context, g Gomega, c client.Client) *admissionregistrationv1.MutatingWebhookConfiguration {
	got := &admissionregistrationv1.MutatingWebhookConfiguration{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: lab.CertManagerWebhookName}, got)).To(Succeed())
	return got
}

func getAPIService(ctx context.Context, g Gomega, c client.Client) *apiregistrationv1.APIService {
	got := &apiregistrationv1.APIService{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: lab.MetricsAPIServiceName}, got)).To(Succeed())
	return got
}

func metricsAvailable(ctx context.Context, g Gomega, c client.Client) apiregistrationv1.APIServiceCondition {
	if cond := apiServiceCondition(getAPIService(ctx, g, c), apiregistrationv1.Available); cond != nil {
		return *cond
	}
	return apiregistrationv1.APIServiceCondition{}
}

func eventuallyBridge(ctx context.Context, g Gomega, c client.Client, gwb *guestnetv1.GuestWebhookBridge, timeout time.Duration,
	check func(g Gomega, got *guestnetv1.GuestWebhookBridge)) *guestnetv1.GuestWebhookBridge {
	var got *guestnetv1.GuestWebhookBridge
	g.Eventually(func(g Gomega) {
		got = &guestnetv1.GuestWebhookBridge{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
		check(g, got)
	}).WithTimeout(timeout).WithPolling(200 * time.Millisecond).Should(Succeed())
	return got
}

// webhooksJSON is the webhooks of a configuration as JSON, with every caBundle set to
// caBundle when it is not nil.
func webhooksJSON(config any, caBundle []byte) string {
	var webhooks []map[string]any
	raw, _ := json.Marshal(config)
	var obj struct {
		Webhooks []map[string]any `json:"webhooks"`
	}
	_ = json.Unmarshal(raw, &obj)
	webhooks = obj.Webhooks
	if caBundle != nil {
		for _, w := range webhooks {
			w["clientConfig"].(map[string]any)["caBundle"] = caBundle
		}
	}
	return jsonString(webhooks)
}

func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
