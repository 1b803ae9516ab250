package guestwebhookbridge_test

// Lab tests of what the GuestWebhookBridge controller does (guestwebhookbridge_phases.go)
// against the lab's real host and guest apiservers and the real kube-controller-manager
// (EndpointSlices of the host Services). The guest objects are those of the
// failures docs/runbook.md describes (lab.CreateServiceWebhook, lab.CreateMetricsAPI). Calls through the bridge, by the
// real guest apiserver to the real cert-manager webhook and metrics-server, are proven in
// e2e/webhookbridge_test.go; here no data path runs, so bridged targets are unreachable and
// say so.
//
// Every test works in namespaces of its own (host and guest), with worker IPs and a guest
// nodePort range of its own, so the tests run in parallel in one lab.
//
// Run with: make test TEST_PKGS=./controllers/guestwebhookbridge/... TEST_ARGS='-run Phases -v'

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/internal/controllertest"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

const (
	waitTimeout = 30 * time.Second
	poll        = 100 * time.Millisecond
	// settleWindow is how long a status must stay unwritten to count as settled.
	settleWindow = 3 * time.Second
	rangeSize    = 4
)

// The chart-installed webhook (service mode, cert-manager's webhook name, timeoutSeconds 5
// as the field report's workaround left it) and metrics API: the bridge creates its guest
// NodePort and ExternalName Services and its host Service, repoints both, and reports each
// target, without touching anything else of theirs.
func TestGuestWebhookBridgePhases_BridgesAWebhookAndAnAPIService(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	wh := e.createWebhook()
	api := e.createMetricsAPI()
	gc := e.createCluster("tenant-a", 2)
	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.APIServices = &guestnetv1.TargetSelector{Names: []string{api.APIService.Name}}
	})

	got := e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue())
		g.Expect(got.Status.BridgedTargets).To(BeEquivalentTo(2))
	})
	hostSvcWebhook := "tenant-a-" + e.webhookNS + "-cert-manager-webhook"
	hostSvcMetrics := "tenant-a-" + e.metricsNS + "-metrics-server"
	webhookURL := "https://" + hostSvcWebhook + "." + e.ns + ".svc/validate"
	g := e.g

	// Status answers the runbook's questions, target by target.
	g.Expect(got.Status.TotalTargets).To(BeEquivalentTo(2))
	g.Expect(got.Status.BridgedTargets).To(BeEquivalentTo(2))
	g.Expect(got.Status.Targets).To(HaveLen(2))
	apiStatus, webhookStatus := got.Status.Targets[0], got.Status.Targets[1]
	g.Expect(apiStatus).To(MatchTarget(guestnetv1.TargetStatus{
		Kind: guestnetv1.APIServiceTarget, Name: api.APIService.Name, GuestService: e.metricsNS + "/metrics-server",
		NodePort: e.nodePort(1), HostService: hostSvcMetrics, TLSServerName: "metrics-server-guestnet." + e.metricsNS + ".svc", Bridged: true,
	}))
	g.Expect(apiStatus.Message).To(ContainSubstring("insecureSkipTLSVerify is true"))
	g.Expect(webhookStatus).To(MatchTarget(guestnetv1.TargetStatus{
		Kind: guestnetv1.ValidatingWebhookTarget, Name: wh.Config.Name, Webhook: lab.WebhookName, GuestService: e.webhookNS + "/cert-manager-webhook",
		NodePort: e.nodePort(0), HostService: hostSvcWebhook, URL: webhookURL, TLSServerName: hostSvcWebhook + "." + e.ns + ".svc", Bridged: true,
	}))
	g.Expect(webhookStatus.Message).To(ContainSubstring("timeoutSeconds is 5, shortened below the default 10"))

	// Nothing carries traffic in this lab: both are unreachable, and say where to look.
	reachable := e.eventuallyCondition(gwb, guestnetv1.TargetsReachableCondition, metav1.ConditionFalse, guestnetv1.EndpointUnreachableReason)
	g.Expect(conditions.Get(reachable, guestnetv1.TargetsReachableCondition).Message).To(And(
		ContainSubstring("no answer through host Service "+e.ns+"/"+hostSvcWebhook),
		ContainSubstring(fmt.Sprintf("declare nodePort %d", e.nodePort(0))),
	))
	g.Expect(conditions.IsFalse(reachable, guestnetv1.ReadyCondition)).To(BeTrue())

	// Guest: a NodePort Service next to each chart Service (same selector, target port, a
	// fixed nodePort of the range); an ExternalName Service for the APIService.
	np := e.getGuestService(e.webhookNS, "cert-manager-webhook-guestnet-nodeport")
	g.Expect(np.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
	g.Expect(np.Spec.Selector).To(Equal(wh.Service.Spec.Selector))
	g.Expect(np.Spec.Ports).To(ConsistOf(MatchPort("https", 443, intstr.FromString("https"), e.nodePort(0))))
	ext := e.getGuestService(e.metricsNS, "metrics-server-guestnet")
	g.Expect(ext.Spec.Type).To(Equal(corev1.ServiceTypeExternalName))
	g.Expect(ext.Spec.ExternalName).To(Equal(hostSvcMetrics + "." + e.ns + ".svc"))
	g.Expect(e.getGuestService(e.metricsNS, "metrics-server").Spec.Type).To(Equal(corev1.ServiceTypeClusterIP), "the chart's Service is untouched")

	// Host: a ClusterIP Service selecting the cluster's worker virt-launcher pods, targetPort
	// = the guest nodePort, owned by the bridge; the real EndpointSlice controller finds both
	// workers behind it.
	host := e.getHostService(hostSvcWebhook)
	g.Expect(host.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
	g.Expect(host.Spec.Selector).To(Equal(map[string]string{
		"cluster.x-k8s.io/cluster-name": "tenant-a", "cluster.x-k8s.io/role": "worker", "kubevirt.io": "virt-launcher",
		"capk.cluster.x-k8s.io/kubevirt-machine-namespace": e.ns,
	}))
	g.Expect(host.Spec.Ports).To(ConsistOf(MatchPort("https", 443, intstr.FromInt32(e.nodePort(0)), 0)))
	g.Expect(host.OwnerReferences).To(ConsistOf(metav1.OwnerReference{
		APIVersion: guestnetv1.GroupVersion.String(), Kind: "GuestWebhookBridge", Name: gwb.Name, UID: got.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}))
	g.Expect(host.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "guestnet"))
	g.Eventually(func() []string { return e.endpointAddresses(hostSvcWebhook) }).WithTimeout(waitTimeout).
		Should(ConsistOf(e.workerIP(1), e.workerIP(2)))

	// The webhook: url instead of service, in one write; caBundle, failurePolicy and
	// timeoutSeconds as they were; the original recorded on the object.
	vwc := e.getWebhookConfig(wh.Config.Name)
	cc := vwc.Webhooks[0].ClientConfig
	g.Expect(cc.Service).To(BeNil())
	g.Expect(cc.URL).To(Equal(ptr.To(webhookURL)))
	g.Expect(cc.CABundle).To(Equal(wh.Config.Webhooks[0].ClientConfig.CABundle))
	g.Expect(vwc.Webhooks[0].TimeoutSeconds).To(Equal(ptr.To[int32](5)), "guestnet never changes the user's timeout")
	g.Expect(vwc.Webhooks[0].FailurePolicy).To(Equal(ptr.To(admissionregistrationv1.Fail)))
	g.Expect(vwc.Annotations[guestnetv1.BridgeOriginalAnnotation]).To(MatchJSON(fmt.Sprintf(
		`{%q: {"bridge": %q, "original": {"namespace": %q, "name": "cert-manager-webhook", "path": "/validate", "port": 443}, "written": %q}}`,
		lab.WebhookName, e.ns+"/bridge", e.webhookNS, webhookURL)))

	// The APIService: pointed at the ExternalName Service, insecureSkipTLSVerify kept.
	apiSvc := e.getAPIService(api.APIService.Name)
	g.Expect(apiSvc.Spec.Service).To(Equal(&apiregistrationv1.ServiceReference{Namespace: e.metricsNS, Name: "metrics-server-guestnet", Port: ptr.To[int32](443)}))
	g.Expect(apiSvc.Spec.InsecureSkipTLSVerify).To(BeTrue())

	e.expectEvent(gwb, "Bridged", "clientConfig.url "+webhookURL)
	e.expectEvent(gwb, "TargetWarning", "timeoutSeconds is 5")
}

// Deleting the bridge puts back exactly what it replaced, and removes every Service it made,
// in the guest and in the host. A caBundle that cainjector rotated meanwhile stays the new one.
func TestGuestWebhookBridgePhases_DeletionRestoresTheOriginalsExactly(t *testing.T) {
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
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)

	// cainjector rotates the CA: it applies caBundle only, as its own field manager.
	rotated := []byte("-----BEGIN CERTIFICATE-----\nrotated\n-----END CERTIFICATE-----\n")
	e.injectCABundle(wh.Config.Name, rotated)
	g := e.g
	g.Consistently(func() []byte { return e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.CABundle }).
		WithTimeout(2*time.Second).Should(Equal(rotated), "guestnet does not fight cainjector")
	g.Expect(e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.URL).NotTo(BeNil())

	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)

	restored := e.getWebhookConfig(wh.Config.Name)
	want := originalWebhooks.Webhooks
	want[0].ClientConfig.CABundle = rotated
	g.Expect(jsonOf(restored.Webhooks)).To(MatchJSON(jsonOf(want)), "the webhooks are as the chart made them, with cainjector's new CA")
	g.Expect(restored.Annotations).To(Equal(originalWebhooks.Annotations))
	restoredAPI := e.getAPIService(api.APIService.Name)
	g.Expect(jsonOf(restoredAPI.Spec)).To(MatchJSON(jsonOf(originalAPIService.Spec)), "byte for byte")
	g.Expect(restoredAPI.Annotations).To(Equal(originalAPIService.Annotations))

	g.Expect(e.guestServices(e.webhookNS)).To(ConsistOf("cert-manager-webhook"))
	g.Expect(e.guestServices(e.metricsNS)).To(ConsistOf("metrics-server"))
	g.Eventually(func() bool {
		_, err := e.tryGetHostService("tenant-a-" + e.webhookNS + "-cert-manager-webhook")
		return apierrors.IsNotFound(err)
	}).WithTimeout(waitTimeout).Should(BeTrue())
	e.expectEvent(gwb, "Restored", "ValidatingWebhookConfiguration "+wh.Config.Name)
}

// A `helm upgrade` puts the chart's service reference back: either as a full replace (the
// guestnet record goes too) or as a merge patch that keeps the annotation. Both are noticed
// through the guest watch and repaired, each with the chart's object as the new original.
func TestGuestWebhookBridgePhases_RepairsAHelmRevert(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	original := e.getWebhookConfig(wh.Config.Name)
	gwb := e.createBridge("bridge", gc.Name)
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	g := e.g

	for _, revert := range []struct {
		name  string
		apply func()
	}{
		{"replace", func() {
			g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
				live := e.getWebhookConfig(wh.Config.Name)
				chart := original.DeepCopy()
				chart.ResourceVersion = live.ResourceVersion
				chart.ManagedFields = nil
				return e.guest.Update(e.ctx, chart, client.FieldOwner("helm"))
			})).To(Succeed())
		}},
		{"merge patch", func() {
			patch := fmt.Sprintf(`{"webhooks":[{"name":%q,"clientConfig":{"url":null,"service":{"namespace":%q,"name":"cert-manager-webhook","path":"/validate","port":443}}}]}`,
				lab.WebhookName, e.webhookNS)
			g.Expect(e.guest.Patch(e.ctx, e.getWebhookConfig(wh.Config.Name), client.RawPatch("application/strategic-merge-patch+json", []byte(patch)),
				client.FieldOwner("helm"))).To(Succeed())
		}},
	} {
		revert.apply()
		reverted := time.Now()
		g.Eventually(func() *admissionregistrationv1.ServiceReference {
			return e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.Service
		}).WithTimeout(10*time.Second).WithPolling(20*time.Millisecond).Should(BeNil(), revert.name)
		t.Logf("%s revert repaired after %s", revert.name, time.Since(reverted).Round(time.Millisecond))
		cc := e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig
		g.Expect(cc.URL).NotTo(BeNil())
	}
	e.expectEvent(gwb, "Repaired", "it no longer pointed at the bridge")

	// The restore after the repairs still gives the chart's object.
	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)
	g.Expect(jsonOf(e.getWebhookConfig(wh.Config.Name).Webhooks)).To(MatchJSON(jsonOf(original.Webhooks)))
}

// The controller killed at any point loses nothing: the rewrite and its record are one
// write, and a restarted controller finds everything as it left it (same nodePort, nothing
// duplicated, no write at all), then restores as usual.
func TestGuestWebhookBridgePhases_ARestartedControllerContinues(t *testing.T) {
	t.Parallel()
	e := newBridgeEnvWithoutManager(t)
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	original := e.getWebhookConfig(wh.Config.Name)
	stop := e.runManager()
	gwb := e.createBridge("bridge", gc.Name)
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	// The first manager has written all it had to (the probe of the target included), so
	// that whatever the restarted one writes is a change it made up.
	e.eventuallySettled(gwb)
	g := e.g
	g.Expect(stop()).To(Succeed())

	before := e.getWebhookConfig(wh.Config.Name)
	npBefore := e.getGuestService(e.webhookNS, "cert-manager-webhook-guestnet-nodeport")
	bridgeBefore := e.getBridge(gwb)
	stop = e.runManager()
	defer func() { _ = stop() }()
	g.Consistently(func() string { return e.getWebhookConfig(wh.Config.Name).ResourceVersion }).
		WithTimeout(3*time.Second).Should(Equal(before.ResourceVersion), "nothing to write after a restart")
	// Nor to the bridge's status: before its first try to connect, the restarted manager
	// does not report the guest unreachable (clusterscope.NotTriedYet).
	bridgeAfter := e.getBridge(gwb)
	g.Expect(bridgeAfter.ResourceVersion).To(Equal(bridgeBefore.ResourceVersion), "the bridge was written: %v\nbefore: %v", bridgeAfter.Status.Conditions, bridgeBefore.Status.Conditions)
	npAfter := e.getGuestService(e.webhookNS, "cert-manager-webhook-guestnet-nodeport")
	g.Expect(npAfter.ResourceVersion).To(Equal(npBefore.ResourceVersion))
	g.Expect(npAfter.Spec.Ports[0].NodePort).To(Equal(e.nodePort(0)))

	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)
	g.Expect(jsonOf(e.getWebhookConfig(wh.Config.Name).Webhooks)).To(MatchJSON(jsonOf(original.Webhooks)))
}

// A target named before it exists is waited for, and bridged as soon as it appears; a
// webhook that already has a url is left alone and said so; a target that is dropped from
// the spec is restored.
func TestGuestWebhookBridgePhases_TargetsComeAndGo(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	gc := e.createCluster("tenant-a", 1)
	urlWebhook := e.webhookConfig("url-"+e.webhookNS, admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://10.2.6.220:32443/validate")})
	g := e.g
	g.Expect(e.guest.Create(e.ctx, urlWebhook)).To(Succeed())
	t.Cleanup(func() { _ = e.guest.Delete(context.Background(), urlWebhook) })
	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.ValidatingWebhooks.Names = append(b.Spec.ValidatingWebhooks.Names, urlWebhook.Name)
	})

	got := e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionFalse, guestnetv1.TargetNotFoundReason)
	g.Expect(conditions.Get(got, guestnetv1.TargetsBridgedCondition).Message).To(ContainSubstring(
		"ValidatingWebhookConfiguration " + e.webhookNS + " does not exist in the guest; guestnet bridges it once it is created"))

	wh := e.createWebhook()
	got = e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.GetReason(got, guestnetv1.TargetsBridgedCondition)).To(Equal(guestnetv1.TargetsBridgedReason))
		g.Expect(got.Status.Targets).To(HaveLen(2))
	})
	g.Expect(conditions.Get(got, guestnetv1.TargetsBridgedCondition).Message).To(HavePrefix("1 of 2 targets bridged; 1 left alone (see status.targets)"))
	urlTarget := got.Status.Targets[1]
	g.Expect(urlTarget.Name).To(Equal(urlWebhook.Name))
	g.Expect(urlTarget.Bridged).To(BeFalse())
	g.Expect(urlTarget.Message).To(ContainSubstring("has clientConfig.url https://10.2.6.220:32443/validate already"))
	g.Expect(e.getWebhookConfig(urlWebhook.Name).Webhooks[0].ClientConfig.URL).To(Equal(ptr.To("https://10.2.6.220:32443/validate")))
	g.Expect(e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.Service).To(BeNil())

	// Dropped from the spec: restored, and its Services go.
	e.updateBridge(gwb, func(b *guestnetv1.GuestWebhookBridge) { b.Spec.ValidatingWebhooks.Names = []string{urlWebhook.Name} })
	g.Eventually(func() *admissionregistrationv1.ServiceReference {
		return e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.Service
	}).WithTimeout(waitTimeout).ShouldNot(BeNil())
	g.Eventually(func() []string { return e.guestServices(e.webhookNS) }).WithTimeout(waitTimeout).Should(ConsistOf("cert-manager-webhook"))
	g.Expect(e.getWebhookConfig(wh.Config.Name).Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
}

// A second bridge that selects a target another bridge has is refused with a condition that
// names the holder; the first keeps working.
func TestGuestWebhookBridgePhases_ASecondBridgeIsRefused(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	first := e.createBridge("first", gc.Name)
	e.eventuallyCondition(first, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	second := e.createBridge("second", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.NodePortRange = guestnetv1.NodePortRange{Start: e.nodePort(2), Size: 2}
	})

	got := e.eventuallyCondition(second, guestnetv1.TargetsBridgedCondition, metav1.ConditionFalse, guestnetv1.TargetClaimedReason)
	e.g.Expect(conditions.Get(got, guestnetv1.TargetsBridgedCondition).Message).To(ContainSubstring(
		"is bridged by GuestWebhookBridge first of this namespace; remove it from one of the two bridges"))
	e.g.Expect(e.guestServices(e.webhookNS)).To(ConsistOf("cert-manager-webhook", "cert-manager-webhook-guestnet-nodeport"))
	e.g.Expect(e.getBridge(first).Status.BridgedTargets).To(BeEquivalentTo(1))
}

// nodePorts other guest Services hold are skipped; when the range has none left, the
// condition names the holders and says what to do.
func TestGuestWebhookBridgePhases_NodePortRange(t *testing.T) {
	t.Parallel()
	e := newBridgeEnv(t)
	e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	g := e.g
	holder := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.webhookNS, Name: "holder"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "holder"},
			Ports: []corev1.ServicePort{{Port: 80, NodePort: e.nodePort(0)}}},
	}
	g.Expect(e.guest.Create(e.ctx, holder)).To(Succeed())

	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.NodePortRange = guestnetv1.NodePortRange{Start: e.nodePort(0), Size: 1}
	})
	got := e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionFalse, guestnetv1.NodePortRangeExhaustedReason)
	g.Expect(conditions.Get(got, guestnetv1.TargetsBridgedCondition).Message).To(ContainSubstring(fmt.Sprintf(
		"no free nodePort in spec.nodePortRange %d-%d", e.nodePort(0), e.nodePort(0))))
	g.Expect(conditions.Get(got, guestnetv1.TargetsBridgedCondition).Message).To(ContainSubstring(fmt.Sprintf(
		"other guest Services hold %d (%s/holder): widen the range", e.nodePort(0), e.webhookNS)))
	g.Expect(e.getWebhookConfig(e.webhookNS).Webhooks[0].ClientConfig.Service).NotTo(BeNil(), "nothing is rewritten that cannot work")

	e.updateBridge(gwb, func(b *guestnetv1.GuestWebhookBridge) { b.Spec.NodePortRange.Size = rangeSize })
	e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue())
		g.Expect(got.Status.Targets).To(HaveLen(1))
		g.Expect(got.Status.Targets[0].NodePort).To(Equal(e.nodePort(1)))
	})
}

// Mode Auto leaves a webhook alone while the guest's konnectivity agents are ready (the
// guest apiserver reaches Services through them). When an APIService that references its
// Service fails its discovery check, the agents evidently do not carry the traffic, and the
// webhook is bridged.
//
// The evidence is guest-wide, so this test does not run in parallel with the others (their
// metrics APIs fail their discovery checks): Go runs it before them.
func TestGuestWebhookBridgePhases_ModeAutoLeavesWhatWorksAlone(t *testing.T) {
	e := newBridgeEnv(t)
	e.createKonnectivityAgent()
	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) { b.Spec.Mode = guestnetv1.BridgeModeAuto })
	g := e.g

	got := e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue())
		g.Expect(got.Status.Targets).To(HaveLen(1))
	})
	g.Expect(got.Status.Targets[0].Message).To(ContainSubstring("left alone (mode Auto): 1 konnectivity agents are ready"))
	g.Expect(got.Status.Targets[0].HostService).To(BeEmpty())
	g.Consistently(func() *admissionregistrationv1.ServiceReference {
		return e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.Service
	}).WithTimeout(time.Second).ShouldNot(BeNil())

	api := e.createMetricsAPI() // an unreachable APIService (Available=False, FailedDiscoveryCheck)
	g.Eventually(func() *admissionregistrationv1.ServiceReference {
		return e.getWebhookConfig(wh.Config.Name).Webhooks[0].ClientConfig.Service
	}).WithTimeout(90 * time.Second).Should(BeNil())
	e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(got.Status.Targets[0].HostService).NotTo(BeEmpty())
	})
	g.Expect(e.getAPIService(api.APIService.Name).Spec.Service.Name).To(Equal("metrics-server"), "not selected: not bridged")
}

// --- environment --------------------------------------------------------------------------

var nextEnv atomic.Int32

// bridgeEnv is one test's share of the lab: a host namespace (Cluster, bridge, host
// Services), guest namespaces for the webhook and the metrics API, worker IPs and a guest
// nodePort range of its own.
type bridgeEnv struct {
	t            *testing.T
	g            Gomega
	ctx          context.Context
	l            *lab.Lab
	host, guest  client.Client
	ns           string
	webhookNS    string
	metricsNS    string
	workerNet    string
	nodePortBase int32
	workers      int
	// chartWebhooks are the webhooks of the test's webhook configuration as created, when a
	// test keeps them.
	chartWebhooks []admissionregistrationv1.ValidatingWebhook
}

func newBridgeEnv(t *testing.T) *bridgeEnv {
	e := newBridgeEnvWithoutManager(t)
	lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupGuestWebhookBridge)
	return e
}

func newBridgeEnvWithoutManager(t *testing.T) *bridgeEnv {
	l := controllertest.Lab(t)
	n := nextEnv.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	suffix := utilrand.String(5)
	e := &bridgeEnv{
		t: t, g: NewWithT(t), ctx: ctx, l: l, host: l.Host.Client, guest: l.Guest.Client,
		ns: "gwb-" + suffix, webhookNS: "cert-manager-" + suffix, metricsNS: "metrics-" + suffix,
		workerNet: fmt.Sprintf("10.244.%d", 20+n), nodePortBase: 31000 + 10*n, // worker IPs must stay in 10.244.0.0/17: up to 107 environments
	}
	e.g.Expect(e.host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}})).To(Succeed())
	return e
}

// runManager starts a manager for the test's namespace and returns what stops it.
func (e *bridgeEnv) runManager() func() error {
	e.t.Helper()
	_, stop, err := lab.RunManager(context.Background(), e.l, manager.Options{WatchNamespace: e.ns}, setupGuestWebhookBridge, logr.Discard())
	e.g.Expect(err).NotTo(HaveOccurred())
	return stop
}

func (e *bridgeEnv) nodePort(i int32) int32 { return e.nodePortBase + i }
func (e *bridgeEnv) workerIP(i int) string  { return fmt.Sprintf("%s.%d", e.workerNet, i) }

// createWebhook installs the webhook of docs/runbook.md's `failed calling webhook` (cert-manager's, by its chart) in the
// test's webhook namespace; its configuration is named after that namespace.
func (e *bridgeEnv) createWebhook() *lab.ServiceWebhook {
	e.t.Helper()
	wh, err := lab.CreateServiceWebhook(e.ctx, e.guest, e.l.Guest.CA.CertPEM(), e.webhookNS, "target-"+e.webhookNS)
	e.g.Expect(err).NotTo(HaveOccurred())
	e.t.Cleanup(func() { _ = e.guest.Delete(context.Background(), wh.Config) })
	return wh
}

func (e *bridgeEnv) createMetricsAPI() *lab.MetricsAPI {
	e.t.Helper()
	api, err := lab.CreateMetricsAPI(e.ctx, e.guest, e.metricsNS, e.metricsNS+".metrics.k8s.io")
	e.g.Expect(err).NotTo(HaveOccurred())
	e.t.Cleanup(func() { _ = e.guest.Delete(context.Background(), api.APIService) })
	return api
}

// webhookConfig is a validating webhook configuration with one webhook calling cc.
func (e *bridgeEnv) webhookConfig(name string, cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "check.example.com",
			ClientConfig: cc,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "nowhere-" + e.webhookNS}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// createCluster creates a guest Cluster whose worker template declares the test's nodePort
// range (so PortsDeclared holds), with workers running it.
func (e *bridgeEnv) createCluster(name string, workers int) *lab.GuestCluster {
	e.t.Helper()
	declared := []int32{22, 10250}
	for i := range int32(rangeSize) {
		declared = append(declared, e.nodePort(i))
	}
	gc, err := e.l.CreateGuestCluster(e.ctx, e.ns, name, lab.WorkerTemplateOptions{Ports: declared})
	e.g.Expect(err).NotTo(HaveOccurred())
	for range workers {
		e.workers++
		_, err := e.l.AddWorker(e.ctx, gc, fmt.Sprintf("%s-w%d", e.ns, e.workers), e.workerIP(e.workers))
		e.g.Expect(err).NotTo(HaveOccurred())
	}
	e.g.Expect(e.l.SetMachineDeploymentStatus(e.ctx, gc, int32(workers), int32(workers))).To(Succeed())
	return gc
}

// createBridge creates a bridge of the test's webhook configuration, mode Always, over the
// test's nodePort range, adjusted by mutate.
func (e *bridgeEnv) createBridge(name, cluster string, mutate ...func(*guestnetv1.GuestWebhookBridge)) *guestnetv1.GuestWebhookBridge {
	e.t.Helper()
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        cluster,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{e.webhookNS}},
			NodePortRange:      guestnetv1.NodePortRange{Start: e.nodePort(0), Size: rangeSize},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	for _, m := range mutate {
		m(gwb)
	}
	e.g.Expect(e.host.Create(e.ctx, gwb)).To(Succeed())
	return gwb
}

func (e *bridgeEnv) getBridge(gwb *guestnetv1.GuestWebhookBridge) *guestnetv1.GuestWebhookBridge {
	got := &guestnetv1.GuestWebhookBridge{}
	e.g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
	return got
}

func (e *bridgeEnv) updateBridge(gwb *guestnetv1.GuestWebhookBridge, mutate func(*guestnetv1.GuestWebhookBridge)) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &guestnetv1.GuestWebhookBridge{}
		if err := e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), got); err != nil {
			return err
		}
		mutate(got)
		return e.host.Update(e.ctx, got)
	})).To(Succeed())
}

func (e *bridgeEnv) eventuallyCondition(gwb *guestnetv1.GuestWebhookBridge, conditionType string, status metav1.ConditionStatus, reason string) *guestnetv1.GuestWebhookBridge {
	e.t.Helper()
	var got *guestnetv1.GuestWebhookBridge
	e.g.Eventually(func(g Gomega) {
		got = &guestnetv1.GuestWebhookBridge{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
		c := conditions.Get(got, conditionType)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(status), "%s: %s", c.Reason, c.Message)
		g.Expect(c.Reason).To(Equal(reason), c.Message)
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return got
}

// eventuallyStatus waits until check passes on the bridge. The patch helper writes the
// conditions and the rest of status in two requests, so a reader can see one reconcile's
// conditions with the previous reconcile's targets for a moment.
func (e *bridgeEnv) eventuallyStatus(gwb *guestnetv1.GuestWebhookBridge, check func(g Gomega, got *guestnetv1.GuestWebhookBridge)) *guestnetv1.GuestWebhookBridge {
	e.t.Helper()
	var got *guestnetv1.GuestWebhookBridge
	e.g.Eventually(func(g Gomega) {
		got = &guestnetv1.GuestWebhookBridge{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
		check(g, got)
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return got
}

// eventuallySettled waits until the bridge's status reports every condition for its current
// generation, the probe's included, and then stays unwritten for settleWindow.
func (e *bridgeEnv) eventuallySettled(gwb *guestnetv1.GuestWebhookBridge) {
	e.t.Helper()
	got := e.eventuallyStatus(gwb, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		for _, t := range []string{guestnetv1.TargetsBridgedCondition, guestnetv1.TargetsReachableCondition, guestnetv1.PortsDeclaredCondition} {
			c := conditions.Get(got, t)
			g.Expect(c).NotTo(BeNil(), "condition %s", t)
			g.Expect(c.ObservedGeneration).To(Equal(got.Generation), "condition %s", t)
		}
	})
	rv := got.ResourceVersion
	e.g.Eventually(func(g Gomega) {
		defer func() { rv = e.getBridge(gwb).ResourceVersion }()
		g.Consistently(func() string { return e.getBridge(gwb).ResourceVersion }).
			WithTimeout(settleWindow).WithPolling(poll).Should(Equal(rv))
	}).WithTimeout(waitTimeout).Should(Succeed(), "the bridge's status keeps changing")
}

func (e *bridgeEnv) eventuallyGone(gwb *guestnetv1.GuestWebhookBridge) {
	e.t.Helper()
	e.g.Eventually(func() bool {
		return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), &guestnetv1.GuestWebhookBridge{}))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(BeTrue())
}

func (e *bridgeEnv) getWebhookConfig(name string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	e.t.Helper()
	got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	e.g.Expect(e.guest.Get(e.ctx, client.ObjectKey{Name: name}, got)).To(Succeed())
	return got
}

func (e *bridgeEnv) getAPIService(name string) *apiregistrationv1.APIService {
	e.t.Helper()
	got := &apiregistrationv1.APIService{}
	e.g.Expect(e.guest.Get(e.ctx, client.ObjectKey{Name: name}, got)).To(Succeed())
	return got
}

func (e *bridgeEnv) getGuestService(ns, name string) *corev1.Service {
	e.t.Helper()
	got := &corev1.Service{}
	e.g.Expect(e.guest.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: name}, got)).To(Succeed())
	return got
}

func (e *bridgeEnv) guestServices(ns string) []string {
	list := &corev1.ServiceList{}
	e.g.Expect(e.guest.List(e.ctx, list, client.InNamespace(ns))).To(Succeed())
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	return names
}

func (e *bridgeEnv) tryGetHostService(name string) (*corev1.Service, error) {
	got := &corev1.Service{}
	return got, e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, got)
}

func (e *bridgeEnv) getHostService(name string) *corev1.Service {
	e.t.Helper()
	got, err := e.tryGetHostService(name)
	e.g.Expect(err).NotTo(HaveOccurred())
	return got
}

// endpointAddresses are the ready addresses the real EndpointSlice controller found for a
// host Service.
func (e *bridgeEnv) endpointAddresses(service string) []string {
	list := &discoveryv1.EndpointSliceList{}
	e.g.Expect(e.host.List(e.ctx, list, client.InNamespace(e.ns), client.MatchingLabels{discoveryv1.LabelServiceName: service})).To(Succeed())
	var out []string
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			if ptr.Deref(ep.Conditions.Ready, false) {
				out = append(out, ep.Addresses...)
			}
		}
	}
	return out
}

// injectCABundle does what cert-manager's cainjector does: a server-side apply of the
// webhook's caBundle only, as its own field manager.
func (e *bridgeEnv) injectCABundle(config string, caBundle []byte) {
	e.t.Helper()
	patch := map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
		"metadata": map[string]any{"name": config},
		"webhooks": []any{map[string]any{"name": lab.WebhookName, "clientConfig": map[string]any{"caBundle": caBundle}}},
	}
	e.g.Expect(e.guest.Patch(e.ctx, e.getWebhookConfig(config), client.RawPatch("application/apply-patch+yaml", []byte(jsonOf(patch))),
		client.FieldOwner("cert-manager-cainjector"), client.ForceOwnership)).To(Succeed())
}

// createKonnectivityAgent creates a ready konnectivity agent pod in the guest's kube-system,
// as k0s runs them (the lab's guest has no kubelet: the status is written by hand).
func (e *bridgeEnv) createKonnectivityAgent() {
	e.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "konnectivity-agent-" + e.webhookNS, Labels: map[string]string{"k8s-app": "konnectivity-agent"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "konnectivity-agent", Image: "quay.io/k0sproject/apiserver-network-proxy-agent:v0.33.0"}}},
	}
	e.g.Expect(e.guest.Create(e.ctx, pod)).To(Succeed())
	e.t.Cleanup(func() { _ = e.guest.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	e.g.Expect(e.guest.Status().Update(e.ctx, pod)).To(Succeed())
}

// expectEvent waits for an event of the bridge with reason whose note contains text.
func (e *bridgeEnv) expectEvent(gwb *guestnetv1.GuestWebhookBridge, reason, text string) {
	e.t.Helper()
	e.g.Eventually(func(g Gomega) {
		list := &eventsv1.EventList{}
		g.Expect(e.host.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
		var notes []string
		for _, ev := range list.Items {
			if ev.Regarding.Name == gwb.Name && ev.Reason == reason {
				notes = append(notes, ev.Note)
			}
		}
		g.Expect(notes).To(ContainElement(ContainSubstring(text)))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
}

// MatchTarget matches a target status, whatever its message and reachability.
func MatchTarget(want guestnetv1.TargetStatus) OmegaMatcher {
	return WithTransform(func(got guestnetv1.TargetStatus) guestnetv1.TargetStatus {
		got.Message, got.Reachable = "", nil
		return got
	}, Equal(want))
}

// MatchPort matches a Service port (nodePort 0: any).
func MatchPort(name string, port int32, target intstr.IntOrString, nodePort int32) OmegaMatcher {
	return WithTransform(func(p corev1.ServicePort) []any {
		if nodePort == 0 {
			p.NodePort = 0
		}
		return []any{p.Name, p.Port, p.TargetPort, p.NodePort, p.Protocol}
	}, Equal([]any{name, port, target, nodePort, corev1.ProtocolTCP}))
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
