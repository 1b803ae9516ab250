package e2e

// Reproductions of the failures docs/runbook.md describes, as they happen without guestnet.
// Each test fails if the failure stops happening.

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// A guest webhook that references a Service is dialed at the Service's ClusterIP. The guest
// apiserver sits on the host network, where guest ClusterIPs lead nowhere, so every request
// the webhook intercepts fails with "failed calling webhook". (In production the packets are
// dropped and the call times out; in the lab the guest service CIDR has no route, so the
// dial fails at once, with the same error.)
func TestFieldFailure_GuestWebhookReferencingServiceFails(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	guest := l.Guest.Client
	webhookNS, appNS := uniqueName("cert-manager"), uniqueName("app")

	// Before the webhook exists, creating a ConfigMap works: the failure below is the webhook's.
	g.Expect(guest.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}})).To(Succeed())
	g.Expect(guest.Create(ctx, configMap(appNS, "before-webhook"))).To(Succeed())

	wh, err := lab.CreateServiceWebhook(ctx, guest, l.Guest.CA.CertPEM(), webhookNS, appNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = guest.Delete(ctx, wh.Config) })

	// The apiserver's webhook configuration cache catches up within a moment.
	var createErr error
	g.Eventually(func() error {
		createErr = guest.Create(ctx, configMap(appNS, uniqueName("after-webhook")))
		return createErr
	}).WithTimeout(30 * time.Second).Should(HaveOccurred())
	g.Expect(createErr.Error()).To(ContainSubstring(`failed calling webhook "` + lab.WebhookName + `"`))
	g.Expect(createErr.Error()).To(ContainSubstring(wh.Service.Spec.ClusterIP+":443"),
		"the guest apiserver dials the Service's ClusterIP, which the host network cannot reach")
}

// An APIService referencing a guest Service (metrics-server) is dialed at the Service's
// ClusterIP, so the aggregator's discovery check fails: Available=False with "failing or
// missing response", and requests for the API fail (`kubectl top`: "Metrics API not available").
func TestFieldFailure_GuestAPIServiceReferencingServiceUnavailable(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	guest := l.Guest.Client
	ns := uniqueName("metrics")
	group := ns + ".metrics.k8s.io" // unique per test; production's is metrics.k8s.io

	api, err := lab.CreateMetricsAPI(ctx, guest, ns, group)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = guest.Delete(ctx, api.APIService) })

	var available *apiregistrationv1.APIServiceCondition
	g.Eventually(func(g Gomega) {
		got := &apiregistrationv1.APIService{}
		g.Expect(guest.Get(ctx, client.ObjectKeyFromObject(api.APIService), got)).To(Succeed())
		available = apiServiceCondition(got, apiregistrationv1.Available)
		g.Expect(available).NotTo(BeNil())
		g.Expect(available.Reason).To(Equal("FailedDiscoveryCheck"))
	}).WithTimeout(60 * time.Second).Should(Succeed())
	g.Expect(available.Status).To(Equal(apiregistrationv1.ConditionFalse))
	g.Expect(available.Message).To(ContainSubstring("failing or missing response from https://" + api.Service.Spec.ClusterIP + ":443"))

	clientset, err := kubernetes.NewForConfig(l.Guest.Config)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = clientset.Discovery().RESTClient().Get().AbsPath("/apis", group, "v1beta1").DoRaw(ctx)
	g.Expect(err).To(HaveOccurred(), "the aggregated API must not answer through the guest apiserver")
}

// The field report's host Service selected virt-launcher pods by the labels it had put in
// virtualMachineTemplate.metadata.labels. KubeVirt does not copy those to the pods: the real
// kube-controller-manager leaves the Service's EndpointSlices empty ("curl: connection
// refused"), while the labels CAPI/CAPK guarantee select every worker.
func TestFieldFailure_HostServiceByVMTemplateLabelsHasNoEndpoints(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("tenant")

	gc, err := l.CreateGuestCluster(ctx, ns, "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, lab.WorkerServicePort}})
	g.Expect(err).NotTo(HaveOccurred())
	w1, err := l.AddWorker(ctx, gc, ns+"-md-0-a", "10.244.1.11")
	g.Expect(err).NotTo(HaveOccurred())
	w2, err := l.AddWorker(ctx, gc, ns+"-md-0-b", "10.244.1.12")
	g.Expect(err).NotTo(HaveOccurred())

	byVMLabels, err := lab.HostServiceForWorkers(ctx, host, ns, "by-vm-template-labels", map[string]string{lab.VMTemplateLabel: gc.WorkerTemplate})
	g.Expect(err).NotTo(HaveOccurred())
	byCAPILabels, err := lab.HostServiceForWorkers(ctx, host, ns, "by-capi-labels", virtlauncher.WorkerSelector(gc.Namespace, gc.Name))
	g.Expect(err).NotTo(HaveOccurred())

	g.Eventually(func() []string { return readyEndpointAddresses(t, l, ns, byCAPILabels.Name) }).
		WithTimeout(30 * time.Second).Should(ConsistOf(w1.IP, w2.IP))

	// The controller manager has processed the other Service too (it writes an empty slice),
	// and it selects nothing.
	g.Eventually(func() []discoveryv1.EndpointSlice { return endpointSlices(t, l, ns, byVMLabels.Name) }).
		WithTimeout(30 * time.Second).ShouldNot(BeEmpty())
	g.Consistently(func() []string { return readyEndpointAddresses(t, l, ns, byVMLabels.Name) }).
		WithTimeout(2 * time.Second).Should(BeEmpty())
}

func configMap(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"k": "v"}}
}

func apiServiceCondition(a *apiregistrationv1.APIService, t apiregistrationv1.APIServiceConditionType) *apiregistrationv1.APIServiceCondition {
	for i := range a.Status.Conditions {
		if a.Status.Conditions[i].Type == t {
			return &a.Status.Conditions[i]
		}
	}
	return nil
}

func endpointSlices(t *testing.T, l *lab.Lab, ns, service string) []discoveryv1.EndpointSlice {
	t.Helper()
	list := &discoveryv1.EndpointSliceList{}
	if err := l.Host.Client.List(testContext(t), list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		t.Fatalf("listing EndpointSlices: %v", err)
	}
	return list.Items
}

func readyEndpointAddresses(t *testing.T, l *lab.Lab, ns, service string) []string {
	var addrs []string
	for _, s := range endpointSlices(t, l, ns, service) {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				addrs = append(addrs, strings.Join(e.Addresses, ","))
			}
		}
	}
	return addrs
}
