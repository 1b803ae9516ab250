package konnectivity

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

// The lab itself: with the agents connected, the guest apiserver calls cert-manager's webhook
// (a service reference: `cluster` egress) and metrics-server (an APIService) through the real
// konnectivity; with every agent stopped, both fail with konnectivity's own error.
func TestKonnectivityLab_ClusterEgressGoesThroughTheAgents(t *testing.T) {
	g := NewWithT(t)
	l, s := start(t)
	ctx := testContext(t, 3*time.Minute)
	guest := l.Guest.Client

	g.Expect(l.Konnectivity.Ready(ctx)).To(Succeed(), "the server has an agent")
	g.Eventually(func() error { return createClusterIssuer(ctx, guest, "konn") }).WithTimeout(time.Minute).Should(Succeed())
	err := guest.Create(ctx, clusterIssuer(uniqueName("invalid"), map[string]any{}))
	g.Expect(err).To(MatchError(ContainSubstring(`admission webhook "` + lab.WebhookName + `" denied the request`)))
	g.Eventually(func() apiregistrationv1.ConditionStatus { return metricsAvailable(ctx, g, guest).Status }).
		WithTimeout(time.Minute).Should(Equal(apiregistrationv1.ConditionTrue))

	stopAgents(t, s)
	err = createClusterIssuer(ctx, guest, "no-agent")
	g.Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "` + lab.WebhookName + `"`)))
	t.Logf("with every agent stopped, the user sees: %v", err)
	g.Eventually(func() apiregistrationv1.ConditionStatus { return metricsAvailable(ctx, g, guest).Status }).
		WithTimeout(2 * time.Minute).Should(Equal(apiregistrationv1.ConditionFalse))
	t.Logf("and the metrics APIService: %s", metricsAvailable(ctx, g, guest).Message)
	g.Expect(l.Konnectivity.Ready(ctx)).To(MatchError(ContainSubstring("500")))
}

// Mode Auto with the real konnectivity: while the agents carry the `cluster` egress, the
// bridge leaves every target alone and the calls work through konnectivity; once the agents
// stop, it takes the webhooks over and the calls work again through it. The APIService it
// takes over keeps failing: the aggregator dials the bridge's name through the `cluster`
// egress too, that is through konnectivity, which has no agent (the docs' limitation).
func TestBridgeAuto_RealKonnectivity(t *testing.T) {
	g := NewWithT(t)
	l, s := start(t)
	ctx := testContext(t, 10*time.Minute)
	guest, host := l.Guest.Client, l.Host.Client
	ns := s.Cluster.Namespace
	const timeout = 60 * time.Second
	startAgents(t, s)

	startDataPath(t, l)
	lab.StartManager(t, l, manager.Options{WatchNamespace: ns}, manager.SetupReconcilers)

	// The user has prepared cert-manager for the bridge (chart value webhook.url.host), so
	// that a bridged call verifies.
	hostService := s.Cluster.Name + "-" + lab.CertManagerNamespace + "-" + lab.CertManagerWebhookName
	serverName := hostService + "." + ns + ".svc"
	g.Expect(s.CertManager.SetWebhookDNSNames(ctx, l, serverName)).To(Succeed())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = s.CertManager.SetWebhookDNSNames(ctx, l)
	})
	chartValidating := getValidating(ctx, g, guest)

	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auto"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        s.Cluster.Name,
			APIServices:        &guestnetv1.TargetSelector{Names: []string{lab.MetricsAPIServiceName}},
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{lab.CertManagerWebhookName}},
			MutatingWebhooks:   &guestnetv1.TargetSelector{Names: []string{lab.CertManagerWebhookName}},
		},
	}
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), gwb) })

	// Healthy agents: every target left alone, and the calls work through konnectivity.
	eventuallyBridge(ctx, g, host, gwb, timeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(got.Status.Targets).To(HaveLen(3))
		for _, tg := range got.Status.Targets {
			g.Expect(tg.Message).To(HavePrefix("left alone (mode Auto)"), "%s", tg.Name)
		}
	})
	g.Expect(getValidating(ctx, g, guest).Webhooks[0].ClientConfig).To(Equal(chartValidating.Webhooks[0].ClientConfig))
	g.Expect(createClusterIssuer(ctx, guest, "healthy")).To(Succeed())
	g.Expect(guest.Create(ctx, clusterIssuer(uniqueName("invalid"), map[string]any{}))).
		To(MatchError(ContainSubstring(`admission webhook "` + lab.WebhookName + `" denied the request`)))

	// The agents stop (their Pods go not Ready, as a crash-looping DaemonSet's do): the calls
	// fail, until the bridge takes the webhooks over.
	stopped := time.Now()
	stopAgents(t, s)
	t.Logf("with the agents stopped, before the bridge acts: %v", createClusterIssuer(ctx, guest, "stopped"))
	g.Eventually(func(g Gomega) {
		cc := getValidating(ctx, g, guest).Webhooks[0].ClientConfig
		g.Expect(cc.Service).To(BeNil())
		g.Expect(cc.URL).To(HaveValue(ContainSubstring(serverName)))
	}).WithTimeout(timeout).WithPolling(200 * time.Millisecond).Should(Succeed())
	t.Logf("the bridge took the webhooks over %s after the agents stopped", time.Since(stopped).Round(time.Second))
	g.Eventually(func() error { return createClusterIssuer(ctx, guest, "bridged") }).WithTimeout(timeout).Should(Succeed())
	g.Expect(guest.Create(ctx, clusterIssuer(uniqueName("invalid"), map[string]any{}))).
		To(MatchError(ContainSubstring(`admission webhook "` + lab.WebhookName + `" denied the request`)))

	// The APIService: bridged (a guest ExternalName Service naming the host Service), and
	// still unavailable, since the aggregator's call goes through konnectivity.
	g.Eventually(func(g Gomega) {
		got := getAPIService(ctx, g, guest)
		g.Expect(got.Spec.Service.Name).NotTo(Equal("metrics-server"))
	}).WithTimeout(timeout).Should(Succeed())
	var seen apiregistrationv1.APIServiceCondition
	g.Eventually(func(g Gomega) {
		seen = metricsAvailable(ctx, g, guest)
		g.Expect(seen.Status).To(Equal(apiregistrationv1.ConditionFalse))
		g.Expect(seen.Message).To(ContainSubstring(".svc"))
	}).WithTimeout(timeout).Should(Succeed())
	t.Logf("the metrics APIService, bridged, with no agent: %s: %s", seen.Reason, seen.Message)
	got := &guestnetv1.GuestWebhookBridge{}
	g.Expect(host.Get(ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
	for _, tg := range got.Status.Targets {
		t.Logf("bridge status of %s %s: bridged=%v reachable=%v %q", tg.Kind, tg.Name, tg.Bridged, ptr.Deref(tg.Reachable, false), tg.Message)
	}
	t.Logf("TargetsReachable: %v", conditions.Get(got, guestnetv1.TargetsReachableCondition))
	t.Logf("Ready: %v", conditions.Get(got, guestnetv1.ReadyCondition))
}

// How mode Auto decides that the agents carry the traffic: the agents' Pods are Ready while
// their process runs (no readiness probe in the DaemonSets users run), connected to the
// server or not. Agents cut off from the server leave every service-referenced call failing.
func TestBridgeAuto_AgentsRunningButCutOff(t *testing.T) {
	g := NewWithT(t)
	l, s := start(t)
	ctx := testContext(t, 5*time.Minute)
	guest := l.Guest.Client
	startAgents(t, s)
	for _, a := range s.Agents {
		a.CutOff()
		t.Cleanup(func() { _ = a.Reconnect() })
	}
	g.Eventually(func() error { return l.Konnectivity.Ready(ctx) }).WithTimeout(time.Minute).Should(HaveOccurred())
	for _, a := range s.Agents {
		pod := &corev1.Pod{}
		g.Expect(guest.Get(ctx, a.Pod, pod)).To(Succeed())
		g.Expect(podReady(pod)).To(BeTrue(), "the agent runs: its Pod is Ready")
	}
	err := createClusterIssuer(ctx, guest, "cut-off")
	g.Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "` + lab.WebhookName + `"`)))
	t.Logf("agents running but cut off, the user sees: %v", err)
}

func startDataPath(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx := testContext(t, time.Minute)
	cilium, err := lab.StartCiliumStandIn(ctx, l)
	if err != nil {
		t.Fatalf("starting the Cilium stand-in: %v", err)
	}
	t.Cleanup(cilium.Stop)
	kp, err := lab.StartGuestKubeProxyStandIn(ctx, l)
	if err != nil {
		t.Fatalf("starting the guest kube-proxy stand-in: %v", err)
	}
	t.Cleanup(kp.Stop)
}

// stopAgents stops every agent; the test's end starts them again.
func stopAgents(t *testing.T, s *setup) {
	t.Helper()
	for _, a := range s.Agents {
		a.Stop()
	}
	t.Cleanup(func() { startAgents(t, s) })
}

func startAgents(t *testing.T, s *setup) {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	for _, a := range s.Agents {
		if err := a.Start(ctx); err != nil {
			t.Errorf("starting the konnectivity agent of %s: %v", a.Worker.Machine, err)
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func clusterIssuer(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

func createClusterIssuer(ctx context.Context, guest client.Client, prefix string) error {
	return guest.Create(ctx, clusterIssuer(uniqueName(prefix), map[string]any{"selfSigned": map[string]any{}}))
}

func getValidating(ctx context.Context, g Gomega, c client.Client) *admissionregistrationv1.ValidatingWebhookConfiguration {
	got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: lab.CertManagerWebhookName}, got)).To(Succeed())
	return got
}

func getAPIService(ctx context.Context, g Gomega, c client.Client) *apiregistrationv1.APIService {
	got := &apiregistrationv1.APIService{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: lab.MetricsAPIServiceName}, got)).To(Succeed())
	return got
}

func metricsAvailable(ctx context.Context, g Gomega, c client.Client) apiregistrationv1.APIServiceCondition {
	for _, cond := range getAPIService(ctx, g, c).Status.Conditions {
		if cond.Type == apiregistrationv1.Available {
			return cond
		}
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
