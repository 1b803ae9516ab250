package konnectivity

import (
	"context"
	"io"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
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

// Mode Auto with the real konnectivity, in a guest without APIServices (nothing else tells
// the bridge about the agents): while the agents carry the `cluster` egress, the bridge leaves
// the webhooks alone and the calls work through konnectivity; once the agents stop, it takes
// the webhooks over and the calls work again through it.
func TestBridgeAuto_RealKonnectivity_Webhooks(t *testing.T) {
	g := NewWithT(t)
	l, s := start(t)
	ctx := testContext(t, 10*time.Minute)
	guest := l.Guest.Client
	const timeout = 60 * time.Second
	startAgents(t, s)
	withoutMetricsAPIService(t, l)
	serverName := startBridging(t, l, s)
	chartValidating := getValidating(ctx, g, guest)

	gwb := createBridge(t, l, s, "webhooks", false)
	// Healthy agents: the webhooks left alone (the guest apiserver reached the webhook's
	// Service through them), and the calls work through konnectivity.
	eventuallyBridge(ctx, g, l.Host.Client, gwb, timeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(got.Status.Targets).To(HaveLen(2))
		for _, tg := range got.Status.Targets {
			g.Expect(tg.Message).To(HavePrefix("left alone (mode Auto): 2 konnectivity agents are ready, "+
				"the guest apiserver reaches Service cert-manager/cert-manager-webhook:443 through them"), "%s", tg.Name)
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
	t.Logf("with the agents stopped, before the bridge acts, the user sees: %v", createClusterIssuer(ctx, guest, "stopped"))
	// Within about 30 s (egressRecheckAfter), not the 5 minutes other answers are kept.
	eventuallyBridged(ctx, g, guest, serverName, 90*time.Second)
	t.Logf("the bridge took the webhooks over %s after the agents stopped", time.Since(stopped).Round(time.Second))
	g.Eventually(func() error { return createClusterIssuer(ctx, guest, "bridged") }).WithTimeout(timeout).Should(Succeed())
	g.Expect(guest.Create(ctx, clusterIssuer(uniqueName("invalid"), map[string]any{}))).
		To(MatchError(ContainSubstring(`admission webhook "` + lab.WebhookName + `" denied the request`)))
}

// How mode Auto decides that the agents carry the traffic, in a guest without APIServices:
// the agents' Pods are Ready while their process runs (the DaemonSets users run have no
// readiness probe), connected to the server or not. With the agents cut off from the server,
// every service-referenced call fails: the bridge must take the webhooks over.
func TestBridgeAuto_AgentsRunningButCutOff(t *testing.T) {
	g := NewWithT(t)
	l, s := start(t)
	ctx := testContext(t, 5*time.Minute)
	guest := l.Guest.Client
	startAgents(t, s)
	withoutMetricsAPIService(t, l)
	serverName := startBridging(t, l, s)
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
	hc, herr := rest.HTTPClientFor(l.Guest.Config)
	g.Expect(herr).NotTo(HaveOccurred())
	resp, herr := hc.Get(l.Guest.Server() + "/api/v1/namespaces/cert-manager/services/https:cert-manager-webhook:443/proxy/")
	g.Expect(herr).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	t.Logf("and the guest apiserver's service proxy answers %s %s: %s", resp.Status, resp.Header.Get("Content-Type"), body)

	gwb := createBridge(t, l, s, "cut-off", false)
	t.Cleanup(func() { logBridge(t, l, gwb) })
	eventuallyBridged(ctx, g, guest, serverName, 60*time.Second)
	g.Eventually(func() error { return createClusterIssuer(ctx, guest, "bridged") }).WithTimeout(time.Minute).Should(Succeed())
}

// logBridge logs the bridge's targets and conditions.
func logBridge(t *testing.T, l *lab.Lab, gwb *guestnetv1.GuestWebhookBridge) {
	got := &guestnetv1.GuestWebhookBridge{}
	if err := l.Host.Client.Get(context.Background(), client.ObjectKeyFromObject(gwb), got); err != nil {
		t.Logf("reading the bridge: %v", err)
		return
	}
	for _, tg := range got.Status.Targets {
		t.Logf("bridge %s: %s %s: bridged=%v %q", gwb.Name, tg.Kind, tg.Name, tg.Bridged, tg.Message)
	}
	for _, c := range got.Status.Conditions {
		t.Logf("bridge %s: %s=%s %s: %s", gwb.Name, c.Type, c.Status, c.Reason, c.Message)
	}
}

// The docs' limitation: an APIService follows the `cluster` egress, i.e. konnectivity, whatever
// Service it names. With the agents stopped, the aggregator cannot reach metrics-server
// through its Service, and would not through the bridge's name either (the call goes to the
// agents all the same; once they are back, they cannot resolve a host Service's name, so a
// bridged APIService would stay broken). Mode Auto takes the webhooks over and leaves the
// APIService as it is, saying why; once the agents are back, the metrics API works again.
func TestBridgeAuto_RealKonnectivity_APIService(t *testing.T) {
	g := NewWithT(t)
	l, s := start(t)
	ctx := testContext(t, 10*time.Minute)
	guest, host := l.Guest.Client, l.Host.Client
	const timeout = 60 * time.Second
	startAgents(t, s)
	startBridging(t, l, s)
	g.Eventually(func() apiregistrationv1.ConditionStatus { return metricsAvailable(ctx, g, guest).Status }).
		WithTimeout(2 * time.Minute).Should(Equal(apiregistrationv1.ConditionTrue))
	chartAPIService := getAPIService(ctx, g, guest)

	gwb := createBridge(t, l, s, "apiservice", true)
	eventuallyBridge(ctx, g, host, gwb, timeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(got.Status.Targets).To(HaveLen(3))
		for _, tg := range got.Status.Targets {
			g.Expect(tg.Message).To(HavePrefix("left alone (mode Auto)"), "%s", tg.Name)
		}
	})

	stopAgents(t, s)
	var seen apiregistrationv1.APIServiceCondition
	g.Eventually(func(g Gomega) {
		seen = metricsAvailable(ctx, g, guest)
		g.Expect(seen.Status).To(Equal(apiregistrationv1.ConditionFalse))
	}).WithTimeout(2 * time.Minute).Should(Succeed())
	t.Logf("the metrics APIService with no agent: %s: %s", seen.Reason, seen.Message)
	g.Expect(seen.Message).To(ContainSubstring("No agent available"))

	// The webhooks are taken over; the APIService is not, and the bridge says why.
	eventuallyBridged(ctx, g, guest, "", timeout)
	// (The bridge's conditions and its targets are two status patches: both are awaited.)
	got := eventuallyBridge(ctx, g, host, gwb, timeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.GetReason(got, guestnetv1.TargetsBridgedCondition)).To(Equal(guestnetv1.APIServiceViaKonnectivityReason))
		for _, tg := range got.Status.Targets {
			if tg.Kind == guestnetv1.APIServiceTarget {
				g.Expect(tg.Bridged).To(BeFalse())
				g.Expect(tg.Message).To(ContainSubstring("the aggregator calls every APIService through them"))
			}
		}
	})
	for _, tg := range got.Status.Targets {
		t.Logf("bridge status of %s %s: bridged=%v %q", tg.Kind, tg.Name, tg.Bridged, tg.Message)
	}
	t.Logf("TargetsBridged: %s", conditions.GetMessage(got, guestnetv1.TargetsBridgedCondition))
	g.Expect(getAPIService(ctx, g, guest).Spec).To(Equal(chartAPIService.Spec), "the APIService is left as it is")
	g.Eventually(func() error { return createClusterIssuer(ctx, guest, "bridged") }).WithTimeout(timeout).Should(Succeed())

	// The agents come back: the metrics API works again, through its own Service.
	startAgents(t, s)
	g.Eventually(func(g Gomega) {
		seen = metricsAvailable(ctx, g, guest)
		g.Expect(seen.Status).To(Equal(apiregistrationv1.ConditionTrue), "%s: %s", seen.Reason, seen.Message)
	}).WithTimeout(2 * time.Minute).Should(Succeed())
}

// startBridging starts what a bridged call goes through (the Cilium and guest kube-proxy
// stand-ins) and the manager, and lets cert-manager's certificate carry the bridge's name
// (the chart value webhook.url.host, set beforehand). It returns that name.
func startBridging(t *testing.T, l *lab.Lab, s *setup) string {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	startDataPath(t, l)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: s.Cluster.Namespace})
	hostService := s.Cluster.Name + "-" + lab.CertManagerNamespace + "-" + lab.CertManagerWebhookName
	serverName := hostService + "." + s.Cluster.Namespace + ".svc"
	if err := s.CertManager.SetWebhookDNSNames(ctx, l, serverName); err != nil {
		t.Fatalf("adding the bridge's name to cert-manager's certificate: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = s.CertManager.SetWebhookDNSNames(ctx, l)
	})
	return serverName
}

// createBridge creates a bridge in mode Auto of cert-manager's webhooks (and the metrics
// APIService); it is deleted, and its targets restored, when the test ends.
func createBridge(t *testing.T, l *lab.Lab, s *setup, name string, apiService bool) *guestnetv1.GuestWebhookBridge {
	t.Helper()
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Cluster.Namespace, Name: name},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        s.Cluster.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{lab.CertManagerWebhookName}},
			MutatingWebhooks:   &guestnetv1.TargetSelector{Names: []string{lab.CertManagerWebhookName}},
		},
	}
	if apiService {
		gwb.Spec.APIServices = &guestnetv1.TargetSelector{Names: []string{lab.MetricsAPIServiceName}}
	}
	ctx := testContext(t, time.Minute)
	if err := l.Host.Client.Create(ctx, gwb); err != nil {
		t.Fatalf("creating the bridge: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = l.Host.Client.Delete(ctx, gwb)
		err := wait(ctx, func() bool {
			return apierrors.IsNotFound(l.Host.Client.Get(ctx, client.ObjectKeyFromObject(gwb), &guestnetv1.GuestWebhookBridge{}))
		})
		if err != nil {
			t.Errorf("the bridge %s was not deleted: %v", name, err)
		}
	})
	return gwb
}

// eventuallyBridged waits until cert-manager's validating webhook is in url mode (naming
// serverName when set).
func eventuallyBridged(ctx context.Context, g Gomega, guest client.Client, serverName string, timeout time.Duration) {
	g.Eventually(func(g Gomega) {
		cc := getValidating(ctx, g, guest).Webhooks[0].ClientConfig
		g.Expect(cc.Service).To(BeNil())
		g.Expect(cc.URL).To(HaveValue(ContainSubstring(serverName)))
	}).WithTimeout(timeout).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// withoutMetricsAPIService deletes the metrics APIService for the test: a guest without
// APIServices, whose failing discovery check would otherwise tell the bridge about the agents.
func withoutMetricsAPIService(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx := testContext(t, time.Minute)
	g := NewWithT(t)
	saved := getAPIService(ctx, g, l.Guest.Client)
	g.Expect(l.Guest.Client.Delete(ctx, saved)).To(Succeed())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		again := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: saved.Name, Labels: saved.Labels, Annotations: saved.Annotations}, Spec: saved.Spec}
		if err := l.Guest.Client.Create(ctx, again); err != nil {
			t.Errorf("restoring the metrics APIService: %v", err)
		}
	})
}

func wait(ctx context.Context, done func() bool) error {
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
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

// startAgents starts every agent that is not running and waits until each is connected
// (an agent cut off and reconnected retries within 10 s).
func startAgents(t *testing.T, s *setup) {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	for _, a := range s.Agents {
		if err := a.Start(ctx); err != nil {
			t.Errorf("starting the konnectivity agent of %s: %v", a.Worker.Machine, err)
		}
		if err := wait(ctx, func() bool { return a.Connected(ctx) == nil }); err != nil {
			t.Errorf("the konnectivity agent of %s does not connect: %v", a.Worker.Machine, err)
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
