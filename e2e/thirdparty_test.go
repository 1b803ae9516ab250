package e2e

// The real third-party servers users run in their guest clusters (cert-manager's webhook and
// cainjector, metrics-server), built from their Go modules at pinned versions and running on
// worker VM addresses in the lab. Before any GuestWebhookBridge, the guest apiserver cannot
// reach them (the field report's failures, with the real servers); called directly from the
// host network, through the masquerade stand-in, they work. The bridge tests flip the former.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// thirdPartySetup is one guest cluster of the shared lab whose two workers run the
// third-party servers: cert-manager's webhook (worker 0) and metrics-server (worker 1), a
// kubelet stand-in on each. Installed once per test binary (the objects are cluster-wide in
// the guest); later tests (the bridge's) reuse it through startThirdParty.
type thirdPartySetup struct {
	Cluster       *lab.GuestCluster
	Workers       []*lab.Worker
	Usage         map[string]lab.KubeletUsage // by machine (= guest Node name)
	CertManager   *lab.CertManager
	MetricsServer *lab.MetricsServer
}

var (
	thirdPartyOnce sync.Once
	thirdParty     *thirdPartySetup
	thirdPartyErr  error
)

// thirdPartyWorkerPorts are the ports the set-up's workers declare: SSH, the kubelet, and the
// servers' own ports, so that the tests can call the servers directly through the
// masquerade stand-in; and the default GuestWebhookBridge nodePort range, as in a worker
// template already rolled for the bridge (the bridge's guest NodePort Services are reached
// through the workers' pod IPs on these ports).
var thirdPartyWorkerPorts = append([]int32{22, lab.KubeletPort, lab.MetricsServerPort, lab.CertManagerWebhookPort},
	portRange(bridgeNodePortFirst, bridgeNodePortCount)...)

// The default GuestWebhookBridge nodePort range: 30064..30079.
const (
	bridgeNodePortFirst int32 = 30064
	bridgeNodePortCount int32 = 16
)

func portRange(first, n int32) []int32 {
	out := make([]int32, 0, n)
	for p := first; p < first+n; p++ {
		out = append(out, p)
	}
	return out
}

func startThirdParty(t *testing.T) (*lab.Lab, *thirdPartySetup) {
	t.Helper()
	l := startLab(t)
	thirdPartyOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		thirdParty, thirdPartyErr = setUpThirdParty(ctx, l)
	})
	if thirdPartyErr != nil {
		t.Fatalf("setting up the third-party servers: %v", thirdPartyErr)
	}
	return l, thirdParty
}

func setUpThirdParty(ctx context.Context, l *lab.Lab) (*thirdPartySetup, error) {
	ns := uniqueName("thirdparty")
	gc, err := l.CreateGuestCluster(ctx, ns, "guest-1", lab.WorkerTemplateOptions{Ports: thirdPartyWorkerPorts})
	if err != nil {
		return nil, err
	}
	s := &thirdPartySetup{Cluster: gc, Usage: map[string]lab.KubeletUsage{}}
	for i, ip := range []string{"10.244.1.231", "10.244.1.232"} {
		w, err := l.AddWorker(ctx, gc, fmt.Sprintf("%s-md-0-%c", ns, 'a'+i), ip)
		if err != nil {
			return nil, err
		}
		usage := lab.KubeletUsage{CPUCores: 0.25 * float64(i+1), MemoryBytes: (1536 + 512*int64(i)) << 20}
		if i == 1 {
			usage.Pods = []lab.PodUsage{lab.MetricsServerPodUsage(0.05, 40<<20)}
		}
		if err := w.ServeKubeletStandIn(usage); err != nil {
			return nil, err
		}
		s.Workers = append(s.Workers, w)
		s.Usage[w.Machine] = usage
	}
	// CAPI's rollout status (no CAPI controller runs in the lab): both workers run the
	// MachineDeployment's template.
	if err := l.SetMachineDeploymentStatus(ctx, gc, 2, 2); err != nil {
		return nil, err
	}
	if s.CertManager, err = l.InstallCertManager(ctx, s.Workers[0]); err != nil {
		return nil, err
	}
	if s.MetricsServer, err = l.InstallMetricsServer(ctx, s.Workers[1]); err != nil {
		return nil, err
	}
	return s, nil
}

// The guest apiserver resolves host Service names as a hosted control plane does with its
// host cluster's DNS (the lab's DNS stand-in, which reads the host apiserver's Services
// live): a webhook whose url names a host Service reaches a server on that Service's
// ClusterIP, under both <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local; a name without a
// Service does not resolve.
func TestThirdPartyLab_GuestAPIServerResolvesHostServiceNames(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	hostNS := uniqueName("dns")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hostNS}})).To(Succeed())

	// A host Service created after the lab started, and a server on its ClusterIP (the host
	// service CIDR is local in the lab namespace). No kube-proxy is involved.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: hostNS, Name: "dns-check"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 8443, TargetPort: intstr.FromInt32(8443)}}},
	}
	g.Expect(l.Host.Client.Create(ctx, svc)).To(Succeed())
	g.Expect(svc.Spec.ClusterIP).To(HavePrefix("10.97."))
	svcName := svc.Name + "." + hostNS + ".svc"
	ca, err := lab.NewCA("dns-check-ca")
	g.Expect(err).NotTo(HaveOccurred())
	certPEM, keyPEM, err := ca.Issue(lab.CertRequest{CommonName: svcName, DNSNames: []string{svcName, svcName + ".cluster.local"}, Server: true})
	g.Expect(err).NotTo(HaveOccurred())
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	g.Expect(err).NotTo(HaveOccurred())
	ln, err := tls.Listen("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "8443"), &tls.Config{Certificates: []tls.Certificate{cert}})
	g.Expect(err).NotTo(HaveOccurred())
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		review := &admissionv1.AdmissionReview{}
		if err := json.NewDecoder(r.Body).Decode(review); err != nil || review.Request == nil {
			http.Error(rw, "bad AdmissionReview", http.StatusBadRequest)
			return
		}
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: false,
			Result: &metav1.Status{Code: http.StatusForbidden, Message: "answered on host ClusterIP for Host " + r.Host}}
		review.Request = nil
		_ = json.NewEncoder(rw).Encode(review)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	// One guest webhook per name, each intercepting ConfigMap creation in a namespace of its own.
	names := map[string]string{
		uniqueName("svc"):     svcName,
		uniqueName("fqdn"):    svcName + ".cluster.local",
		uniqueName("missing"): "missing." + hostNS + ".svc",
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: hostNS}}
	for ns, host := range names {
		g.Expect(l.Guest.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		vwc.Webhooks = append(vwc.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name:         ns + ".lab.guestnet.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + host + ":8443/validate"), CABundle: ca.CertPEM()},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		})
	}
	g.Expect(l.Guest.Client.Create(ctx, vwc)).To(Succeed())
	t.Cleanup(func() { _ = l.Guest.Client.Delete(context.Background(), vwc) })

	for ns, host := range names {
		var createErr error
		g.Eventually(func() error {
			createErr = l.Guest.Client.Create(ctx, configMap(ns, uniqueName("cm")))
			return createErr
		}).WithTimeout(30*time.Second).Should(HaveOccurred(), "webhook for %s", host)
		if strings.HasPrefix(host, "missing.") {
			g.Expect(createErr.Error()).To(ContainSubstring("failed calling webhook"))
			g.Expect(createErr.Error()).To(ContainSubstring("no such host"), "a name without a host Service must not resolve")
			continue
		}
		g.Expect(createErr.Error()).To(ContainSubstring("answered on host ClusterIP for Host "+host+":8443"),
			"the guest apiserver resolved %s to the host Service's ClusterIP and verified TLS for it", host)
	}
}

// By hand, what a GuestWebhookBridge will build for cert-manager's webhook, to prove the data
// path it relies on is real in the lab, every hop but the guest apiserver's DNS answer and the
// two forwarders being the real thing:
//
//	guest apiserver -> https://<host-svc>.<ns>.svc:443 (host DNS stand-in -> host ClusterIP)
//	-> host ClusterIP:443 (Cilium stand-in as kube-proxy) -> a ready endpoint of the host
//	Service's EndpointSlice (real kube-controller-manager: the cluster's virt-launcher pods)
//	-> worker pod IP:30078 (masquerade stand-in: declared port) -> VM address:30078 (guest
//	kube-proxy stand-in: the guest NodePort Service) -> cert-manager-webhook pod:https (the
//	real webhook, restarted with the host name in its certificate, as the chart value
//	webhook.url.host does).
//
// Then the webhook's CA is rotated (its Secret deleted): the real webhook makes a new one, the
// real cainjector injects it, also into a configuration in url mode, and the chain verifies
// against the new caBundle only.
//
// The chart's webhook configurations are left untouched (the bridge will rewrite them; this
// test must not). The webhook serves the chart's names alone again when the test ends; the
// rotated CA stays (InjectedCABundle reads the current one).
func TestThirdPartyLab_HandMadeBridgeReachesCertManagerWebhook(t *testing.T) {
	g := NewWithT(t)
	l, tp := startThirdParty(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	guest, host := l.Guest.Client, l.Host.Client
	cm := tp.CertManager
	const nodePort = bridgeNodePortFirst + 14 // 30078, in the range the workers declare
	const timeout = 30 * time.Second

	// Guest: a NodePort Service next to the chart's, same selector and target port.
	guestSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: lab.CertManagerNamespace, Name: uniqueName("cert-manager-webhook-bridge")},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: cm.Service.Spec.Selector,
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("https"), NodePort: nodePort}},
		},
	}
	g.Expect(guest.Create(ctx, guestSvc)).To(Succeed())
	t.Cleanup(func() { _ = guest.Delete(context.Background(), guestSvc) })

	// Host: a ClusterIP Service in the cluster's namespace selecting its workers' virt-launcher
	// pods by the labels CAPI/CAPK guarantee, forwarding 443 to the guest nodePort.
	ns := tp.Cluster.Namespace
	hostSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uniqueName("cm-webhook")},
		Spec: corev1.ServiceSpec{
			Selector: virtlauncher.WorkerSelector(tp.Cluster.Namespace, tp.Cluster.Name),
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(nodePort)}},
		},
	}
	g.Expect(host.Create(ctx, hostSvc)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), hostSvc) })
	hostName := hostSvc.Name + "." + ns + ".svc"
	clusterIPAddr := net.JoinHostPort(hostSvc.Spec.ClusterIP, "443")
	g.Expect(hostSvc.Spec.ClusterIP).To(HavePrefix("10.97."))

	startCiliumStandIn(t, l)
	kp, err := lab.StartGuestKubeProxyStandIn(ctx, l)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kp.Stop)

	// The webhook serves the host Service's name too. Registered first, so it runs last: the
	// webhook serves the chart's names alone again after the test.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cm.SetWebhookDNSNames(ctx, l); err != nil {
			t.Errorf("restoring the webhook's DNS names: %v", err)
		}
	})
	start := time.Now()
	g.Expect(cm.SetWebhookDNSNames(ctx, l, hostName)).To(Succeed())
	t.Logf("webhook restarted with %v in %s", cm.WebhookDNSNames(), time.Since(start).Round(time.Millisecond))
	caBundle, err := cm.InjectedCABundle(ctx, guest)
	g.Expect(err).NotTo(HaveOccurred())

	// Hop by hop: the real EndpointSlice holds both workers; each worker's pod IP reaches the
	// webhook through the masquerade and guest kube-proxy stand-ins; the ClusterIP reaches it
	// through either worker (round robin: four connections use both).
	g.Eventually(func() []string { return readyEndpointAddresses(t, l, ns, hostSvc.Name) }).
		WithTimeout(timeout).Should(ConsistOf(tp.Workers[0].IP, tp.Workers[1].IP))
	for _, w := range tp.Workers {
		addr := net.JoinHostPort(w.IP, strconv.Itoa(int(nodePort)))
		g.Eventually(func() error { return lab.VerifyTLS(ctx, addr, hostName, caBundle) }).
			WithTimeout(timeout).Should(Succeed(), "the guest nodePort through worker %s", w.Machine)
	}
	g.Eventually(func() error { return lab.VerifyTLS(ctx, clusterIPAddr, hostName, caBundle) }).
		WithTimeout(timeout).Should(Succeed(), "the host ClusterIP")
	for range 4 {
		g.Expect(lab.VerifyTLS(ctx, clusterIPAddr, hostName, caBundle)).To(Succeed())
	}

	// Through the real guest apiserver. Admission calls every mutating webhook (their
	// configurations in name order) before any validating one, and the chart's
	// MutatingWebhookConfiguration (service mode, no namespaceSelector) intercepts every
	// Issuer and fails: a validating copy would never be called. The copy is therefore a
	// MutatingWebhookConfiguration whose name sorts before the chart's, calling cert-manager's
	// /validate in url mode (an answer without a patch is valid from a mutating webhook),
	// limited to a fresh namespace. So:
	//   - an invalid Issuer is denied by cert-manager's own validation, reached through the
	//     bridged path, before the chart's webhook is called;
	//   - a valid Issuer passes the copy, then fails on the chart's own mutating webhook,
	//     dialing the webhook Service's guest ClusterIP as before any bridge: proof that the
	//     copy admitted it (a denial or a failure would name the copy).
	// The copy carries cainjector's annotation and no caBundle: the real cainjector injects it
	// into a configuration in url mode.
	issuerNS := uniqueName("issuers")
	g.Expect(guest.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: issuerNS}})).To(Succeed())
	// The guest runs no namespace controller: the empty namespace stays Terminating.
	t.Cleanup(func() {
		_ = guest.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: issuerNS}})
	})
	copyName := uniqueName("bridge-copy")
	g.Expect(copyName < cm.MutatingWebhook.Name).To(BeTrue(), "the copy must be called before the chart's mutating webhook")
	copyWebhook := "copy." + lab.WebhookName
	validating := cm.ValidatingWebhook.Webhooks[0]
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{
			Name:        copyName,
			Annotations: map[string]string{lab.CertManagerInjectCAFromSecretAnnotation: lab.CertManagerNamespace + "/" + lab.CertManagerWebhookCASecret},
		},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    copyWebhook,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + hostName + ":443/validate")},
			Rules:                   validating.Rules,
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: issuerNS}},
			MatchPolicy:             validating.MatchPolicy,
			FailurePolicy:           validating.FailurePolicy,
			SideEffects:             validating.SideEffects,
			TimeoutSeconds:          validating.TimeoutSeconds,
			AdmissionReviewVersions: validating.AdmissionReviewVersions,
		}},
	}
	g.Expect(guest.Create(ctx, mwc)).To(Succeed())
	t.Cleanup(func() { _ = guest.Delete(context.Background(), mwc) })
	copyBundle := func(g Gomega) []byte {
		got := &admissionregistrationv1.MutatingWebhookConfiguration{}
		g.Expect(guest.Get(ctx, client.ObjectKeyFromObject(mwc), got)).To(Succeed())
		g.Expect(got.Webhooks[0].ClientConfig.Service).To(BeNil())
		return got.Webhooks[0].ClientConfig.CABundle
	}
	g.Eventually(copyBundle).WithTimeout(timeout).Should(Equal(caBundle), "cainjector injects into a configuration in url mode")

	expectBridgedValidation := func() {
		t.Helper()
		var denied string
		g.Eventually(func() string {
			err := guest.Create(ctx, issuer(issuerNS, uniqueName("invalid"), map[string]any{}))
			if err == nil {
				return "created"
			}
			denied = err.Error()
			return denied
		}).WithTimeout(timeout).Should(ContainSubstring(`admission webhook "`+copyWebhook+`" denied the request`),
			"the guest apiserver's webhook configuration cache catches up within a moment")
		g.Expect(denied).To(ContainSubstring("at least one issuer must be configured"))
		g.Expect(denied).NotTo(ContainSubstring("failed calling webhook"))
		t.Logf("invalid Issuer, through the guest apiserver and the bridged path: %s", denied)

		err := guest.Create(ctx, issuer(issuerNS, uniqueName("valid"), map[string]any{"selfSigned": map[string]any{}}))
		g.Expect(err).To(HaveOccurred(), "the chart's service-mode webhook still fails")
		g.Expect(err.Error()).To(ContainSubstring(`failed calling webhook "` + lab.WebhookName + `"`))
		g.Expect(err.Error()).To(ContainSubstring(cm.Service.Spec.ClusterIP+":443"), "the chart's webhook, by its guest ClusterIP")
		g.Expect(err.Error()).NotTo(ContainSubstring(copyWebhook), "the copy admitted the valid Issuer")
	}
	expectBridgedValidation()

	// CA rotation.
	start = time.Now()
	oldBundle, newBundle, err := cm.RotateCA(ctx, guest)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("CA rotated, new caBundle injected and served in %s (webhook restarts for cert-manager's stale serving certificate so far: %d)",
		time.Since(start).Round(time.Millisecond), cm.StaleLeafRestarts())
	g.Expect(oldBundle).To(Equal(caBundle))
	g.Expect(newBundle).NotTo(Equal(oldBundle))
	g.Expect(lab.VerifyTLS(ctx, clusterIPAddr, hostName, newBundle)).To(Succeed(), "the chain, with the new caBundle")
	g.Expect(lab.VerifyTLS(ctx, clusterIPAddr, hostName, oldBundle)).To(MatchError(ContainSubstring("certificate signed by unknown authority")),
		"the old caBundle no longer verifies")
	g.Eventually(copyBundle).WithTimeout(timeout).Should(Equal(newBundle), "cainjector injects the new CA in url mode too")
	expectBridgedValidation()
}

// Before any bridge, creating a cert-manager ClusterIssuer through the guest apiserver fails:
// the chart's webhook configurations reference the webhook's guest Service, whose ClusterIP
// the guest apiserver (on the host network) cannot reach, although the real webhook runs.
func TestThirdParty_CertManagerWebhookUnreachableFromGuestAPIServer(t *testing.T) {
	g := NewWithT(t)
	l, tp := startThirdParty(t)
	ctx := testContext(t)

	var createErr error
	g.Eventually(func() error {
		createErr = l.Guest.Client.Create(ctx, clusterIssuer(uniqueName("selfsigned"), map[string]any{"selfSigned": map[string]any{}}))
		return createErr
	}).WithTimeout(30 * time.Second).Should(HaveOccurred())
	g.Expect(createErr.Error()).To(ContainSubstring(`failed calling webhook "` + lab.WebhookName + `"`))
	g.Expect(createErr.Error()).To(ContainSubstring(tp.CertManager.Service.Spec.ClusterIP+":443"),
		"the guest apiserver dials the webhook Service's guest ClusterIP")
}

// Before any bridge, metrics-server's APIService (from its release manifests) is
// Available=False: the aggregator dials the guest Service's ClusterIP.
func TestThirdParty_MetricsAPIServiceUnavailableThroughGuestAPIServer(t *testing.T) {
	g := NewWithT(t)
	l, tp := startThirdParty(t)
	ctx := testContext(t)

	var available *apiregistrationv1.APIServiceCondition
	g.Eventually(func(g Gomega) {
		got := &apiregistrationv1.APIService{}
		g.Expect(l.Guest.Client.Get(ctx, client.ObjectKey{Name: lab.MetricsAPIServiceName}, got)).To(Succeed())
		available = apiServiceCondition(got, apiregistrationv1.Available)
		g.Expect(available).NotTo(BeNil())
		g.Expect(available.Reason).To(Equal("FailedDiscoveryCheck"))
	}).WithTimeout(60 * time.Second).Should(Succeed())
	g.Expect(available.Status).To(Equal(apiregistrationv1.ConditionFalse))
	g.Expect(available.Message).To(ContainSubstring("failing or missing response from https://" + tp.MetricsServer.Service.Spec.ClusterIP + ":443"))

	clientset, err := kubernetes.NewForConfig(l.Guest.Config)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = clientset.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/nodes").DoRaw(ctx)
	g.Expect(err).To(HaveOccurred(), "`kubectl top nodes` fails: the metrics API is not available through the guest apiserver")
}

// Called directly from the host network at the worker's pod IP (through the masquerade
// stand-in), the real cert-manager webhook works: it serves a certificate that verifies for
// its Service name against the caBundle the real cainjector injected (from the CA Secret the
// webhook created), and its own validation denies an invalid ClusterIssuer and admits a
// valid one. The certificate carries DNS names only, so it does not verify for the IP.
func TestThirdParty_CertManagerWebhookAnswersOnWorker(t *testing.T) {
	g := NewWithT(t)
	l, tp := startThirdParty(t)
	ctx := testContext(t)
	w := tp.CertManager.Worker
	addr := net.JoinHostPort(w.IP, strconv.Itoa(int(lab.CertManagerWebhookPort)))

	caBundle, err := tp.CertManager.InjectedCABundle(ctx, l.Guest.Client)
	g.Expect(err).NotTo(HaveOccurred())
	caSecret := &corev1.Secret{}
	g.Expect(l.Guest.Client.Get(ctx, client.ObjectKey{Namespace: lab.CertManagerNamespace, Name: lab.CertManagerWebhookCASecret}, caSecret)).To(Succeed())
	g.Expect(string(caBundle)).To(Equal(string(caSecret.Data["ca.crt"])), "cainjector injected the webhook's CA from its Secret")

	g.Expect(lab.VerifyTLS(ctx, addr, lab.CertManagerWebhookServerName, caBundle)).To(Succeed())
	g.Expect(lab.VerifyTLS(ctx, addr, lab.CertManagerWebhookServerName, l.Guest.CA.CertPEM())).
		To(MatchError(ContainSubstring("certificate signed by unknown authority")), "TLS is verified against the injected CA, not any CA")
	g.Expect(lab.VerifyTLS(ctx, addr, w.IP, caBundle)).To(MatchError(ContainSubstring("doesn't contain any IP SANs")),
		"cert-manager's serving certificate has DNS names only: a url with an IP host cannot verify")

	denied := postAdmissionReview(t, addr, caBundle, clusterIssuer("invalid", map[string]any{}))
	g.Expect(denied.Allowed).To(BeFalse())
	g.Expect(denied.Result).NotTo(BeNil())
	g.Expect(denied.Result.Message).To(ContainSubstring("at least one issuer must be configured"))
	t.Logf("cert-manager's webhook denied the invalid ClusterIssuer: %s", denied.Result.Message)

	allowed := postAdmissionReview(t, addr, caBundle, clusterIssuer("valid", map[string]any{"selfSigned": map[string]any{}}))
	g.Expect(allowed.Allowed).To(BeTrue(), "a valid ClusterIssuer is admitted: %+v", allowed.Result)
}

// Called directly from the host network at the worker's pod IP (through the masquerade
// stand-in) with the guest's front-proxy client certificate, as the guest aggregator would
// call it, the real metrics-server answers the resource metrics API with the numbers the
// kubelet stand-ins serve, for the nodes and for its own pod. Without the front-proxy
// certificate the same request is refused.
func TestThirdParty_MetricsServerAnswersOnWorker(t *testing.T) {
	g := NewWithT(t)
	_, tp := startThirdParty(t)
	ctx := testContext(t)
	ms := tp.MetricsServer
	podIP := ms.Worker.IP

	// metrics-server reports a node once it has two scrapes of it (--metric-resolution=10s).
	var nodes metricsList
	g.Eventually(func(g Gomega) {
		body, err := ms.Get(ctx, podIP, "/apis/metrics.k8s.io/v1beta1/nodes")
		g.Expect(err).NotTo(HaveOccurred())
		nodes = metricsList{}
		g.Expect(json.Unmarshal(body, &nodes)).To(Succeed())
		for _, w := range tp.Workers {
			g.Expect(nodes.byName()).To(HaveKey(w.Machine))
		}
	}).WithTimeout(90 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
	g.Expect(nodes.Kind).To(Equal("NodeMetricsList"))
	for _, w := range tp.Workers {
		want := tp.Usage[w.Machine]
		got := nodes.byName()[w.Machine]
		g.Expect(got.Usage.Memory().Value()).To(Equal(want.MemoryBytes), "memory of %s", w.Machine)
		g.Expect(got.Usage.Cpu().MilliValue()).To(BeNumerically("~", int64(want.CPUCores*1000), 2), "CPU of %s", w.Machine)
		t.Logf("metrics-server: node %s cpu=%s memory=%s", w.Machine, got.Usage.Cpu(), got.Usage.Memory())
	}

	var pod podMetrics
	g.Eventually(func(g Gomega) {
		body, err := ms.Get(ctx, podIP, "/apis/metrics.k8s.io/v1beta1/namespaces/"+lab.MetricsServerNamespace+"/pods/"+lab.MetricsServerPodName)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(json.Unmarshal(body, &pod)).To(Succeed())
	}).WithTimeout(60 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
	want := tp.Usage[ms.Worker.Machine].Pods[0]
	g.Expect(pod.Containers).To(HaveLen(1))
	g.Expect(pod.Containers[0].Name).To(Equal(want.Container))
	g.Expect(pod.Containers[0].Usage.Memory().Value()).To(Equal(want.MemoryBytes))
	g.Expect(pod.Containers[0].Usage.Cpu().MilliValue()).To(BeNumerically("~", int64(want.CPUCores*1000), 2))

	// The same request without the front-proxy certificate: anonymous, and refused.
	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // metrics-server's self-signed certificate
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(podIP, strconv.Itoa(int(lab.MetricsServerPort)))+"/apis/metrics.k8s.io/v1beta1/nodes", http.NoBody)
	g.Expect(err).NotTo(HaveOccurred())
	req.Header.Set("X-Remote-User", "lab-admin")
	req.Header.Set("X-Remote-Group", "system:masters")
	resp, err := plain.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(BeElementOf(http.StatusUnauthorized, http.StatusForbidden),
		"request headers count only from the front-proxy client certificate")
}

// Nothing the lab runs, the third-party servers included, listens on a wildcard address of
// the lab's network namespace: every server is bound to its own address (cert-manager's
// webhook, which binds every address of its pod, runs in a pod network namespace).
func TestThirdParty_NothingListensOnWildcardAddresses(t *testing.T) {
	g := NewWithT(t)
	startThirdParty(t)
	var wildcard []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"} {
		data, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 {
				continue
			}
			local, state := fields[1], fields[3]
			listening := state == "0A" || (strings.HasPrefix(f, "/proc/net/udp") && state == "07")
			host, port, _ := strings.Cut(local, ":")
			p, _ := strconv.ParseUint(port, 16, 16)
			if listening && p != 0 && strings.Trim(host, "0") == "" {
				wildcard = append(wildcard, fmt.Sprintf("%s port %d", f, p))
			}
		}
	}
	g.Expect(wildcard).To(BeEmpty())
}

// issuer is a cert-manager Issuer in namespace ns with the given spec.
func issuer(ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": spec,
	}}
}

// clusterIssuer is a cert-manager ClusterIssuer with the given spec.
func clusterIssuer(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

// postAdmissionReview sends an AdmissionReview for creating obj to cert-manager's /validate
// at addr, verifying TLS for the webhook's Service name against caBundle, as the guest
// apiserver would.
func postAdmissionReview(t *testing.T, addr string, caBundle []byte, obj *unstructured.Unstructured) *admissionv1.AdmissionResponse {
	t.Helper()
	g := NewWithT(t)
	raw, err := json.Marshal(obj.Object)
	g.Expect(err).NotTo(HaveOccurred())
	uid := "lab-" + uniqueName("review")
	// As the apiserver sends it (cert-manager reads requestResource, for one).
	gvk := metav1.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "ClusterIssuer"}
	gvr := metav1.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "clusterissuers"}
	review := &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:             types.UID(uid),
			Kind:            gvk,
			Resource:        gvr,
			RequestKind:     &gvk,
			RequestResource: &gvr,
			Name:            obj.GetName(),
			Operation:       admissionv1.Create,
			UserInfo:        authenticationv1.UserInfo{Username: "lab-admin", Groups: []string{"system:masters", "system:authenticated"}},
			Object:          runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(review)
	g.Expect(err).NotTo(HaveOccurred())

	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(caBundle)).To(BeTrue())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: lab.CertManagerWebhookServerName, MinVersion: tls.VersionTLS12},
	}}
	resp, err := hc.Post("https://"+addr+"/validate", "application/json", bytes.NewReader(body))
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	out := &admissionv1.AdmissionReview{}
	g.Expect(json.NewDecoder(resp.Body).Decode(out)).To(Succeed())
	g.Expect(out.Response).NotTo(BeNil())
	g.Expect(string(out.Response.UID)).To(Equal(uid), "the webhook answers the review it was sent")
	return out.Response
}

// metricsList is a NodeMetricsList (metrics.k8s.io/v1beta1), as much of it as the tests read.
type metricsList struct {
	Kind  string `json:"kind"`
	Items []struct {
		Metadata metav1.ObjectMeta   `json:"metadata"`
		Usage    corev1.ResourceList `json:"usage"`
	} `json:"items"`
}

type nodeUsage struct{ Usage corev1.ResourceList }

func (m metricsList) byName() map[string]nodeUsage {
	out := map[string]nodeUsage{}
	for _, i := range m.Items {
		out[i.Metadata.Name] = nodeUsage{Usage: i.Usage}
	}
	return out
}

// podMetrics is a PodMetrics (metrics.k8s.io/v1beta1), as much of it as the tests read.
type podMetrics struct {
	Containers []struct {
		Name  string              `json:"name"`
		Usage corev1.ResourceList `json:"usage"`
	} `json:"containers"`
}
