package lab

// The real third-party servers users run in their guest clusters, run in the lab as guest
// workloads: cert-manager's webhook and cainjector, and metrics-server, built from their Go
// modules at pinned versions (hack/tools/*, see LookupThirdParty). They run as processes of
// the lab on a worker's VM address and talk to the GUEST apiserver with the identity of
// their chart's ServiceAccount (a real ServiceAccount token from the TokenRequest API, so
// the chart's RBAC is what authorizes them). The guest objects are those their
// chart/manifests install (Services, webhook configurations, APIService, RBAC, CRDs); the
// lab's guest has no controller manager and no kubelet, so the lab writes the Pods' status
// and the EndpointSlices that those would keep.
//
// Everything here is cluster-wide in the guest (CRDs, webhook configurations, the
// v1beta1.metrics.k8s.io APIService): install each at most once per lab.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// cert-manager as its Helm chart (release "cert-manager" in namespace "cert-manager")
// installs it.
const (
	CertManagerNamespace      = "cert-manager"
	CertManagerWebhookName    = "cert-manager-webhook"
	CertManagerCAInjectorName = "cert-manager-cainjector"
	// CertManagerWebhookCASecret holds the CA the webhook signs its serving certificate with
	// (--dynamic-serving-ca-secret-name); cainjector copies its ca.crt into the caBundle of
	// the webhook configurations that name it in CertManagerInjectCAFromSecretAnnotation.
	CertManagerWebhookCASecret              = "cert-manager-webhook-ca"
	CertManagerInjectCAFromSecretAnnotation = "cert-manager.io/inject-ca-from-secret"
	// CertManagerWebhookPort is the webhook's --secure-port. The chart's default is 10250;
	// in the lab the webhook shares its VM address with the kubelet stand-in (a real pod
	// has an IP of its own), so it uses 10260, a value users set on private GKE clusters.
	CertManagerWebhookPort int32 = 10260
)

// CertManagerWebhookServerName is the TLS server name the guest apiserver verifies when it
// calls the webhook through its Service: <svc>.<ns>.svc. The webhook's serving certificate
// carries it (--dynamic-serving-dns-names), and DNS names only.
const CertManagerWebhookServerName = CertManagerWebhookName + "." + CertManagerNamespace + ".svc"

// metrics-server as its release manifests (components.yaml) install it.
const (
	MetricsServerNamespace = "kube-system"
	MetricsServerName      = "metrics-server"
	// MetricsServerPort is metrics-server's --secure-port (the manifests' 10250 would clash
	// with the kubelet stand-in on the same VM address; 4443 was their default until v0.5).
	MetricsServerPort int32 = 4443
	// MetricsAPIServiceName is the APIService of the resource metrics API (`kubectl top`).
	MetricsAPIServiceName = "v1beta1.metrics.k8s.io"
	// MetricsServerPodName names the guest Pod that stands in for metrics-server's pod.
	MetricsServerPodName = "metrics-server-5dd7b49d79-lab01"
)

// CertManagerChartDNSNames are the webhook's --dynamic-serving-dns-names as the chart sets
// them: the webhook Service's names.
var CertManagerChartDNSNames = []string{
	CertManagerWebhookName, CertManagerWebhookName + "." + CertManagerNamespace, CertManagerWebhookServerName,
}

// CertManager is cert-manager's webhook and cainjector running in the lab's guest.
type CertManager struct {
	// Worker is the worker VM the webhook's pod runs on (its port is published on the
	// worker's VM address, see podNetns).
	Worker *Worker
	// Service is the chart's webhook Service; its EndpointSlice points at the webhook.
	Service           *corev1.Service
	ValidatingWebhook *admissionregistrationv1.ValidatingWebhookConfiguration
	MutatingWebhook   *admissionregistrationv1.MutatingWebhookConfiguration

	// What (re)starting the webhook takes (see startWebhook).
	dir        string // the lab's thirdparty directory: logs, kubeconfigs
	bin        string // the cert-manager-webhook binary
	kubeconfig string // the webhook ServiceAccount's kubeconfig
	netns      *podNetns
	cainjector *process

	mu       sync.Mutex // serializes restarts; guards what follows
	webhook  *process
	dnsNames []string // the running webhook's --dynamic-serving-dns-names
	starts   int
	// staleLeafRestarts counts the restarts RotateCA made because the webhook kept serving
	// a certificate signed by the old CA.
	staleLeafRestarts int
}

const (
	// certManagerReadyTimeout bounds the wait for the webhook to serve with the injected CA.
	certManagerReadyTimeout = 2 * time.Minute
	// staleLeafGrace is how long RotateCA lets the webhook serve a certificate that the new
	// CA does not verify before it takes it for cert-manager's rotation race (see RotateCA).
	// A rotation takes a second or two in the lab.
	staleLeafGrace = 30 * time.Second
)

// StaleLeafRestarts is how often RotateCA restarted the webhook because it kept serving a
// certificate signed by the old CA (cert-manager's rotation race, see RotateCA).
func (cm *CertManager) StaleLeafRestarts() int {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	return cm.staleLeafRestarts
}

// InstallCertManager installs cert-manager in the guest as its chart does (CRDs, namespace,
// ServiceAccounts, RBAC, the webhook Service, the validating and mutating webhook
// configurations annotated for cainjector) and runs the real webhook and cainjector as
// workloads on worker w, then waits until cainjector has injected the webhook's CA into both
// configurations and the webhook serves with a certificate that verifies against it.
//
// Processes: the webhook runs in a pod network namespace of its own (it binds every address
// of its pod; see podNetns), published on w.VMAddress:CertManagerWebhookPort; cainjector
// binds nothing (metrics off, no probes, no leader election) and runs in the lab namespace.
// Both stop with the lab; their logs are <lab>/thirdparty/cert-manager-*.log.
func (l *Lab) InstallCertManager(ctx context.Context, w *Worker) (*CertManager, error) {
	if w.OnKernelDatapath() {
		return nil, errThirdPartyOnKernelWorker
	}
	tp, err := l.Assets.LookupThirdParty()
	if err != nil {
		return nil, err
	}
	dir, err := l.thirdPartyDir()
	if err != nil {
		return nil, err
	}
	c := l.Guest.Client
	if _, err := envtest.InstallCRDs(l.Guest.Config, envtest.CRDInstallOptions{
		Paths: []string{tp.CertManagerCRDDir}, ErrorIfPathMissing: true, MaxTime: time.Minute, PollInterval: 100 * time.Millisecond,
	}); err != nil {
		return nil, fmt.Errorf("installing cert-manager CRDs in the guest: %w", err)
	}
	if err := createNamespaces(ctx, c, CertManagerNamespace); err != nil {
		return nil, err
	}
	for _, o := range certManagerRBAC() {
		if err := c.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}

	webhookLabels := map[string]string{
		"app": "webhook", "app.kubernetes.io/name": "webhook", "app.kubernetes.io/instance": "cert-manager",
		"app.kubernetes.io/component": "webhook", "app.kubernetes.io/version": "v1.11.5",
	}
	selector := map[string]string{"app.kubernetes.io/name": "webhook", "app.kubernetes.io/instance": "cert-manager", "app.kubernetes.io/component": "webhook"}
	cm := &CertManager{Worker: w, dir: dir, bin: tp.CertManagerWebhook}
	cm.Service = &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: CertManagerNamespace, Name: CertManagerWebhookName, Labels: webhookLabels},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("https")}},
		},
	}
	if err := c.Create(ctx, cm.Service); err != nil {
		return nil, fmt.Errorf("creating the webhook Service: %w", err)
	}
	if err := l.createWorkloadPod(ctx, w, CertManagerNamespace, "cert-manager-webhook-6c9dd55dc8-lab01", CertManagerWebhookName, webhookLabels,
		corev1.ContainerPort{Name: "https", ContainerPort: CertManagerWebhookPort, Protocol: corev1.ProtocolTCP}); err != nil {
		return nil, err
	}
	if err := createEndpointSlice(ctx, c, cm.Service, "cert-manager-webhook-6c9dd55dc8-lab01", w.VMAddress, "https", CertManagerWebhookPort); err != nil {
		return nil, err
	}
	cm.ValidatingWebhook, cm.MutatingWebhook = certManagerWebhookConfigurations(webhookLabels)
	if err := c.Create(ctx, cm.ValidatingWebhook); err != nil {
		return nil, fmt.Errorf("creating the ValidatingWebhookConfiguration: %w", err)
	}
	if err := c.Create(ctx, cm.MutatingWebhook); err != nil {
		return nil, fmt.Errorf("creating the MutatingWebhookConfiguration: %w", err)
	}

	if cm.kubeconfig, err = l.serviceAccountKubeconfig(ctx, dir, CertManagerNamespace, CertManagerWebhookName); err != nil {
		return nil, err
	}
	cainjectorKubeconfig, err := l.serviceAccountKubeconfig(ctx, dir, CertManagerNamespace, CertManagerCAInjectorName)
	if err != nil {
		return nil, err
	}

	// cainjector first: it must be watching when the webhook creates its CA Secret.
	if cm.cainjector, err = startProcess(dir, "cert-manager-cainjector", tp.CertManagerCAInjector,
		"--v=2",
		"--kubeconfig="+cainjectorKubeconfig,
		"--leader-elect=false",
		"--enable-profiling=false",
	); err != nil {
		return nil, err
	}
	l.onStop(cm.cainjector.stop)

	if cm.netns, err = newPodNetns(dir, "cert-manager-webhook"); err != nil {
		return nil, err
	}
	l.onStop(cm.netns.close)
	if err := cm.startWebhook(CertManagerChartDNSNames); err != nil {
		return nil, err
	}
	l.onStop(cm.stopWebhook)
	if err := cm.netns.publish(w, CertManagerWebhookPort); err != nil {
		return nil, err
	}
	if err := cm.waitServing(ctx, c, nil, certManagerReadyTimeout); err != nil {
		return nil, err
	}
	return cm, nil
}

// startWebhook starts the webhook process in its pod network namespace, with the chart's
// flags and dnsNames as --dynamic-serving-dns-names; the only place that builds its command
// line. The first run logs to cert-manager-webhook.log, restarts to
// cert-manager-webhook-<n>.log. Call with cm.mu held, or before cm is shared.
func (cm *CertManager) startWebhook(dnsNames []string) error {
	bin, args := cm.netns.command(cm.bin,
		"--v=2",
		"--kubeconfig="+cm.kubeconfig,
		"--secure-port="+strconv.Itoa(int(CertManagerWebhookPort)),
		"--healthz-port=6080",
		"--dynamic-serving-ca-secret-namespace="+CertManagerNamespace,
		"--dynamic-serving-ca-secret-name="+CertManagerWebhookCASecret,
		"--dynamic-serving-dns-names="+strings.Join(dnsNames, ","),
	)
	name := "cert-manager-webhook"
	if cm.starts > 0 {
		name += "-" + strconv.Itoa(cm.starts+1)
	}
	p, err := startProcess(cm.dir, name, bin, args...)
	if err != nil {
		return err
	}
	cm.starts++
	cm.webhook, cm.dnsNames = p, slices.Clone(dnsNames)
	return nil
}

// stopWebhook stops the running webhook process.
func (cm *CertManager) stopWebhook() {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	cm.webhook.stop()
}

// WebhookDNSNames are the names the running webhook's serving certificate carries.
func (cm *CertManager) WebhookDNSNames() []string {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	return slices.Clone(cm.dnsNames)
}

// waitServing waits (up to within) until cainjector has injected a caBundle into both
// webhook configurations, different from notBundle when that is set and equal to the CA
// Secret's ca.crt, and the webhook serves, on its VM address, a certificate that verifies
// against it for every name in cm.dnsNames. Call with cm.mu held, or before cm is shared.
func (cm *CertManager) waitServing(ctx context.Context, c client.Client, notBundle []byte, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	addr := net.JoinHostPort(cm.Worker.VMAddress, strconv.Itoa(int(CertManagerWebhookPort)))
	err := cm.webhook.waitReady(ctx, func(ctx context.Context) error {
		if err := cm.cainjector.exited(); err != nil {
			return err
		}
		bundle, err := cm.InjectedCABundle(ctx, c)
		if err != nil {
			return err
		}
		if notBundle != nil && bytes.Equal(bundle, notBundle) {
			return errors.New("cainjector has not injected a new caBundle yet")
		}
		secret := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: CertManagerNamespace, Name: CertManagerWebhookCASecret}, secret); err != nil {
			return err
		}
		if !bytes.Equal(bundle, secret.Data["ca.crt"]) {
			return errors.New("the injected caBundle is not (yet) the CA Secret's ca.crt")
		}
		for _, name := range cm.dnsNames {
			if err := VerifyTLS(ctx, addr, name, bundle); err != nil {
				return fmt.Errorf("TLS for %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cert-manager not ready (cainjector log %s): %w", cm.cainjector.logPath, err)
	}
	return nil
}

// SetWebhookDNSNames restarts the real webhook with --dynamic-serving-dns-names set to the
// chart's names (CertManagerChartDNSNames) plus extra, as a user does with the chart value
// webhook.url.host (or the flag through webhook.extraArgs), and waits until it serves a
// certificate that verifies for every one of those names against the injected caBundle. The
// webhook keeps its CA (the Secret), so the caBundle does not change. Without extra, the
// webhook serves the chart's names again. The webhook refuses connections while it restarts
// (a second or two); its new log is <lab>/thirdparty/cert-manager-webhook-<n>.log.
func (cm *CertManager) SetWebhookDNSNames(ctx context.Context, l *Lab, extra ...string) error {
	names := slices.Clone(CertManagerChartDNSNames)
	for _, n := range extra {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	cm.mu.Lock()
	defer cm.mu.Unlock()
	cm.webhook.stop()
	if err := cm.startWebhook(names); err != nil {
		return err
	}
	return cm.waitServing(ctx, l.Guest.Client, nil, certManagerReadyTimeout)
}

// RotateCA makes the webhook rotate its CA the way an operator does: it deletes the CA Secret
// (CertManagerWebhookCASecret). The real webhook notices, creates a new CA in a new Secret
// and serves a certificate signed by it; the real cainjector injects the new CA into both
// webhook configurations. RotateCA waits (up to 30 s, then 2 minutes after a restart) until both carry the new caBundle,
// different from the old one and equal to the new Secret's ca.crt, and the webhook serves a
// certificate that verifies against it for every name it serves; a webhook that still serves
// one signed by the old CA after staleLeafGrace is restarted once (cert-manager's rotation
// race, below). It returns the old and the new caBundle. Later callers of InjectedCABundle
// see the new one.
func (cm *CertManager) RotateCA(ctx context.Context, c client.Client) (oldBundle, newBundle []byte, err error) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if oldBundle, err = cm.InjectedCABundle(ctx, c); err != nil {
		return nil, nil, err
	}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: CertManagerNamespace, Name: CertManagerWebhookCASecret}, secret); err != nil {
		return nil, nil, err
	}
	if err := c.Delete(ctx, secret, client.Preconditions{UID: &secret.UID}); err != nil {
		return nil, nil, fmt.Errorf("deleting the webhook's CA Secret: %w", err)
	}
	err = cm.waitServing(ctx, c, oldBundle, staleLeafGrace)
	if staleLeaf := new(x509.UnknownAuthorityError); errors.As(err, staleLeaf) {
		// cert-manager before v1.16.0 tells its serving certificate source that the CA
		// rotated before it switches to the new CA, so the new serving certificate can be
		// signed by the old one and served until it expires (fixed upstream by commit
		// 45a52cc, "add unit tests for tls authority logic and improve logs"). The new CA
		// is injected by then, so the webhook refuses every call; an operator restarts it,
		// and so does the lab. StaleLeafRestarts says how often.
		cm.webhook.stop()
		if err := cm.startWebhook(cm.dnsNames); err != nil {
			return nil, nil, err
		}
		cm.staleLeafRestarts++
		err = cm.waitServing(ctx, c, oldBundle, certManagerReadyTimeout)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("after deleting the CA Secret: %w", err)
	}
	if newBundle, err = cm.InjectedCABundle(ctx, c); err != nil {
		return nil, nil, err
	}
	return oldBundle, newBundle, nil
}

// InjectedCABundle returns the caBundle cainjector injected into every webhook of the chart's
// two webhook configurations, once it has (they must all agree). It reads clientConfig.caBundle
// only, so it works whether the configurations reference the Service (the chart's) or carry a
// url (as after a GuestWebhookBridge rewrote them): cainjector injects in either mode.
func (cm *CertManager) InjectedCABundle(ctx context.Context, c client.Client) ([]byte, error) {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm.ValidatingWebhook), vwc); err != nil {
		return nil, err
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm.MutatingWebhook), mwc); err != nil {
		return nil, err
	}
	if len(vwc.Webhooks) == 0 || len(mwc.Webhooks) == 0 {
		return nil, errors.New("webhook configurations have no webhooks")
	}
	var bundles [][]byte
	for _, w := range vwc.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, w := range mwc.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, b := range bundles {
		if len(b) == 0 {
			return nil, errors.New("cainjector has not injected the caBundle yet")
		}
		if !bytes.Equal(b, bundles[0]) {
			return nil, errors.New("the webhooks of the validating and mutating webhook configurations have different caBundles")
		}
	}
	return bundles[0], nil
}

// VerifyTLS completes a TLS handshake with addr, verifying the server's certificate for
// serverName against the PEM caBundle, as the apiserver does when it calls a webhook.
func VerifyTLS(ctx context.Context, addr, serverName string, caBundle []byte) error {
	conn, err := TLSDial(ctx, addr, serverName, caBundle)
	if err != nil {
		return err
	}
	return conn.Close()
}

// TLSDial connects to addr with TLS verified for serverName against the PEM caBundle.
func TLSDial(ctx context.Context, addr, serverName string, caBundle []byte) (*tls.Conn, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		return nil, errors.New("caBundle holds no PEM certificate")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return conn.(*tls.Conn), nil
}

// certManagerWebhookConfigurations are the chart's webhook configurations (chart defaults:
// service mode, timeoutSeconds 10, failurePolicy Fail), with the cainjector annotation and no
// caBundle yet.
func certManagerWebhookConfigurations(labels map[string]string) (*admissionregistrationv1.ValidatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhookConfiguration) {
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name:        CertManagerWebhookName,
			Labels:      labels,
			Annotations: map[string]string{CertManagerInjectCAFromSecretAnnotation: CertManagerNamespace + "/" + CertManagerWebhookCASecret},
		}
	}
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"cert-manager.io", "acme.cert-manager.io"}, APIVersions: []string{"v1"}, Resources: []string{"*/*"}},
	}}
	clientConfig := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
			Namespace: CertManagerNamespace, Name: CertManagerWebhookName, Path: ptr.To(path), Port: ptr.To[int32](443),
		}}
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: meta(),
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: WebhookName,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "cert-manager.io/disable-validation", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"}},
				{Key: "name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{CertManagerNamespace}},
			}},
			Rules:                   rules,
			AdmissionReviewVersions: []string{"v1"},
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			TimeoutSeconds:          ptr.To[int32](10),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			ClientConfig:            clientConfig("/validate"),
		}},
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: meta(),
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    WebhookName,
			Rules:                   rules,
			AdmissionReviewVersions: []string{"v1"},
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			TimeoutSeconds:          ptr.To[int32](10),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			ClientConfig:            clientConfig("/mutate"),
		}},
	}
	return vwc, mwc
}

// certManagerRBAC is the chart's RBAC for the webhook and cainjector (cainjector's leader
// election Role is left out: the lab runs it with --leader-elect=false).
func certManagerRBAC() []client.Object {
	sa := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: CertManagerNamespace, Name: name}
	}
	dynamicServing := CertManagerWebhookName + ":dynamic-serving"
	sar := CertManagerWebhookName + ":subjectaccessreviews"
	return []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: CertManagerNamespace, Name: CertManagerWebhookName}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: CertManagerNamespace, Name: CertManagerCAInjectorName}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: CertManagerNamespace, Name: dynamicServing},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{CertManagerWebhookCASecret}, Verbs: []string{"get", "list", "watch", "update"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: CertManagerNamespace, Name: dynamicServing},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: dynamicServing},
			Subjects:   []rbacv1.Subject{sa(CertManagerWebhookName)},
		},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: sar},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}}},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: sar},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sar},
			Subjects:   []rbacv1.Subject{sa(CertManagerWebhookName)},
		},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: CertManagerCAInjectorName},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"get", "create", "update", "patch"}},
				{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingwebhookconfigurations", "mutatingwebhookconfigurations"}, Verbs: []string{"get", "list", "watch", "update"}},
				{APIGroups: []string{"apiregistration.k8s.io"}, Resources: []string{"apiservices"}, Verbs: []string{"get", "list", "watch", "update"}},
				{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch", "update"}},
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: CertManagerCAInjectorName},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: CertManagerCAInjectorName},
			Subjects:   []rbacv1.Subject{sa(CertManagerCAInjectorName)},
		},
	}
}

// MetricsServer is metrics-server running in the lab's guest.
type MetricsServer struct {
	// Worker is the worker VM metrics-server's pod runs on; it listens on the worker's VM
	// address (--bind-address), port MetricsServerPort.
	Worker     *Worker
	Service    *corev1.Service
	APIService *apiregistrationv1.APIService
	// client has the front-proxy client certificate (FrontProxyClient).
	client *http.Client
}

// InstallMetricsServer installs metrics-server in the guest from its release manifests
// (components.yaml: ServiceAccount, RBAC, Service, the APIService v1beta1.metrics.k8s.io with
// insecureSkipTLSVerify; the Deployment is what the process stands in for) and runs the real
// metrics-server as a workload on worker w, bound to w.VMAddress:MetricsServerPort. It
// scrapes the kubelets at each guest Node's InternalIP (the workers' pod IPs) on KubeletPort:
// start a kubelet stand-in on the workers (Worker.ServeKubeletStandIn) to give it data. It
// authenticates and authorizes its own clients with the guest apiserver (delegated, with the
// front-proxy CA from kube-system/extension-apiserver-authentication, as on real clusters).
// Waits until metrics-server reports ready; stops with the lab; log
// <lab>/thirdparty/metrics-server.log.
func (l *Lab) InstallMetricsServer(ctx context.Context, w *Worker) (*MetricsServer, error) {
	if w.OnKernelDatapath() {
		return nil, errThirdPartyOnKernelWorker
	}
	tp, err := l.Assets.LookupThirdParty()
	if err != nil {
		return nil, err
	}
	dir, err := l.thirdPartyDir()
	if err != nil {
		return nil, err
	}
	c := l.Guest.Client
	manifests, err := os.ReadFile(tp.MetricsServerManifests)
	if err != nil {
		return nil, err
	}
	objs, err := DecodeObjects(manifests)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", tp.MetricsServerManifests, err)
	}
	ms := &MetricsServer{Worker: w}
	if ms.client, err = l.FrontProxyClient(); err != nil {
		return nil, err
	}
	var podLabels map[string]string
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			podLabels, _, _ = unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
			continue // the process below stands in for its pod
		}
		if err := c.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	ms.Service = &corev1.Service{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: MetricsServerNamespace, Name: MetricsServerName}, ms.Service); err != nil {
		return nil, fmt.Errorf("metrics-server manifests: Service: %w", err)
	}
	ms.APIService = &apiregistrationv1.APIService{}
	if err := c.Get(ctx, client.ObjectKey{Name: MetricsAPIServiceName}, ms.APIService); err != nil {
		return nil, fmt.Errorf("metrics-server manifests: APIService: %w", err)
	}
	if err := l.createWorkloadPod(ctx, w, MetricsServerNamespace, MetricsServerPodName, MetricsServerName, podLabels,
		corev1.ContainerPort{Name: "https", ContainerPort: MetricsServerPort, Protocol: corev1.ProtocolTCP}); err != nil {
		return nil, err
	}
	if err := createEndpointSlice(ctx, c, ms.Service, MetricsServerPodName, w.VMAddress, "https", MetricsServerPort); err != nil {
		return nil, err
	}
	kubeconfig, err := l.serviceAccountKubeconfig(ctx, dir, MetricsServerNamespace, MetricsServerName)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "metrics-server-certs")
	proc, err := startProcess(dir, "metrics-server", tp.MetricsServer,
		"--v=2",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--bind-address="+w.VMAddress,
		"--secure-port="+strconv.Itoa(int(MetricsServerPort)),
		"--cert-dir="+certDir,
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-port="+strconv.Itoa(KubeletPort),
		"--kubelet-insecure-tls",
		"--kubelet-request-timeout=5s",
		"--metric-resolution=10s",
		"--profiling=false",
	)
	if err != nil {
		return nil, err
	}
	l.onStop(proc.stop)
	if w.forwardsEveryPort() {
		// A worker without a ports list forwards every port the VM serves.
		if err := w.nat.forward(MetricsServerPort); err != nil {
			return nil, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := proc.waitReady(waitCtx, func(ctx context.Context) error {
		_, err := ms.Get(ctx, w.VMAddress, "/readyz")
		return err
	}); err != nil {
		return nil, err
	}
	return ms, nil
}

// Get calls metrics-server directly at host (its VM address, or the worker's pod IP through
// the masquerade stand-in) as the guest apiserver's aggregator does: with the front-proxy
// client certificate and the user in X-Remote-User/X-Remote-Group (lab-admin,
// system:masters), without verifying metrics-server's self-signed certificate (the
// APIService's insecureSkipTLSVerify). It returns the body of a 200 answer.
func (ms *MetricsServer) Get(ctx context.Context, host, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url := "https://" + net.JoinHostPort(host, strconv.Itoa(int(MetricsServerPort))) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Remote-User", "lab-admin")
	req.Header.Set("X-Remote-Group", "system:masters")
	resp, err := ms.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, nil
}

// FrontProxyClient is an HTTP client with the guest's front-proxy client certificate (CN
// front-proxy-client, signed by l.Guest.FrontProxyCA), the identity the guest aggregator
// presents to aggregated API servers. It does not verify servers, and keeps no connections.
func (l *Lab) FrontProxyClient() (*http.Client, error) {
	certPEM, keyPEM, err := l.Guest.FrontProxyCA.Issue(CertRequest{CommonName: "front-proxy-client", Client: true})
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}, //nolint:gosec // as the APIService's insecureSkipTLSVerify
	}}, nil
}

// MetricsServerPodUsage is a PodUsage for metrics-server's stand-in pod, for the kubelet
// stand-in of the worker it runs on.
func MetricsServerPodUsage(cpuCores float64, memoryBytes int64) PodUsage {
	return PodUsage{Namespace: MetricsServerNamespace, Name: MetricsServerPodName, Container: MetricsServerName, CPUCores: cpuCores, MemoryBytes: memoryBytes}
}

// serviceAccountKubeconfig creates the ServiceAccount ns/name in the guest (if missing),
// requests a token for it (TokenRequest, as the kubelet does for a pod's projected token)
// and writes a kubeconfig with it for the guest apiserver; it returns the file's path.
func (l *Lab) serviceAccountKubeconfig(ctx context.Context, dir, ns, name string) (string, error) {
	c := l.Guest.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := c.Create(ctx, sa); client.IgnoreAlreadyExists(err) != nil {
		return "", fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, name, err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", ns, name, err)
	}
	user := "system:serviceaccount:" + ns + ":" + name
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["guest"] = &clientcmdapi.Cluster{Server: l.Guest.Server(), CertificateAuthorityData: l.Guest.CA.CertPEM()}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["guest"] = &clientcmdapi.Context{Cluster: "guest", AuthInfo: user, Namespace: ns}
	cfg.CurrentContext = "guest"
	path := filepath.Join(dir, ns+"-"+name+".kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// createWorkloadPod creates the guest Pod a workload's controller would have created, on the
// worker's Node, and sets the status its kubelet would report (running, ready, the pod IP
// being the VM address the workload serves on).
// errThirdPartyOnKernelWorker: the third-party servers run in the lab namespace on a
// worker's VM address, which the guest apiserver dials as the workload's guest pod IP; a
// kernel worker's VM is a namespace of its own whose address (10.0.2.2) no guest pod IP can
// be, since the lab has no guest pod network there yet (docs/lab.md, what moved).
var errThirdPartyOnKernelWorker = errors.New("third-party servers run on userspace workers only (their guest pod IP is the VM's lab address)")

func (l *Lab) createWorkloadPod(ctx context.Context, w *Worker, ns, name, serviceAccount string, labels map[string]string, port corev1.ContainerPort) error {
	c := l.Guest.Client
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:           w.Machine,
			ServiceAccountName: serviceAccount,
			Containers:         []corev1.Container{{Name: serviceAccount, Image: "lab.guestnet.dev/" + serviceAccount, Ports: []corev1.ContainerPort{port}}},
		},
	}
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating guest Pod %s/%s: %w", ns, name, err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: w.IP, PodIP: w.VMAddress, PodIPs: []corev1.PodIP{{IP: w.VMAddress}}, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: serviceAccount, Image: pod.Spec.Containers[0].Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting status of guest Pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// createEndpointSlice writes the EndpointSlice the guest's EndpointSlice controller would
// keep for svc (the lab's guest runs no controller manager): one ready endpoint at address,
// referring to its Pod (the apiserver's service proxy only dials endpoints that do).
func createEndpointSlice(ctx context.Context, c client.Client, svc *corev1.Service, pod, address, portName string, port int32) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: svc.Name + "-lab",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "lab.guestnet.dev"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{address}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: pod}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.Create(ctx, slice); err != nil {
		return fmt.Errorf("creating EndpointSlice for %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return nil
}

func (l *Lab) thirdPartyDir() (string, error) {
	dir := filepath.Join(l.Dir, "thirdparty")
	return dir, os.MkdirAll(dir, 0o700)
}

// exited returns an error, with the end of its log, once the process has exited.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); log tail:\n%s", p.name, p.err, p.logTail()) //nolint:errorlint // p.err is nil after a clean exit: %w would print %!w(<nil>)
	default:
		return nil
	}
}
