package lab

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The guest-side objects of the failures docs/runbook.md describes, as charts install them. Tests and the
// demo build them here, once.

// ServiceWebhook is a validating webhook that references a guest Service, as cert-manager's
// chart installs it, intercepting ConfigMap creation in one namespace.
type ServiceWebhook struct {
	Service *corev1.Service
	Config  *admissionregistrationv1.ValidatingWebhookConfiguration
}

// WebhookName is the webhook's name inside its configuration (cert-manager's).
const WebhookName = "webhook.cert-manager.io"

// CreateServiceWebhook creates, in the guest, the namespace webhookNS with a webhook Service,
// and a ValidatingWebhookConfiguration (named webhookNS) whose webhook references that Service
// and intercepts ConfigMap creation in namespace targetNS.
func CreateServiceWebhook(ctx context.Context, c client.Client, caBundle []byte, webhookNS, targetNS string) (*ServiceWebhook, error) {
	if err := createNamespaces(ctx, c, webhookNS, targetNS); err != nil {
		return nil, err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: webhookNS, Name: "cert-manager-webhook"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": "webhook"},
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}},
		},
	}
	if err := c.Create(ctx, svc); err != nil {
		return nil, fmt.Errorf("creating webhook Service: %w", err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookNS},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: WebhookName,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: webhookNS, Name: svc.Name, Path: ptr.To("/validate"), Port: ptr.To[int32](443)},
				CABundle: caBundle,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: targetNS}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		}},
	}
	if err := c.Create(ctx, vwc); err != nil {
		return nil, fmt.Errorf("creating ValidatingWebhookConfiguration: %w", err)
	}
	return &ServiceWebhook{Service: svc, Config: vwc}, nil
}

// MetricsAPI is an aggregated API served by a guest Service, as metrics-server's chart
// installs it.
type MetricsAPI struct {
	Service    *corev1.Service
	APIService *apiregistrationv1.APIService
}

// MetricsServerPodIP is where the lab pretends the guest's metrics-server pod runs (guest
// pod CIDR, unreachable from the host network).
const MetricsServerPodIP = "10.245.1.10"

// CreateMetricsAPI creates, in the guest namespace ns, a metrics-server Service with the
// EndpointSlice the guest's controller manager would keep for its pod, and an APIService
// v1beta1.<group> referencing the Service with insecureSkipTLSVerify (the chart's default).
// group is metrics.k8s.io in production; tests use unique groups to run side by side.
func CreateMetricsAPI(ctx context.Context, c client.Client, ns, group string) (*MetricsAPI, error) {
	if err := createNamespaces(ctx, c, ns); err != nil {
		return nil, err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "metrics-server"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"k8s-app": "metrics-server"},
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}},
		},
	}
	if err := c.Create(ctx, svc); err != nil {
		return nil, fmt.Errorf("creating metrics-server Service: %w", err)
	}
	// The lab's guest runs no controller manager: write what it would keep for the pod.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: svc.Name + "-lab",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "lab.guestnet.dev"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{MetricsServerPodIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](10250), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.Create(ctx, slice); err != nil {
		return nil, fmt.Errorf("creating metrics-server EndpointSlice: %w", err)
	}
	apiService := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "v1beta1." + group},
		Spec: apiregistrationv1.APIServiceSpec{
			Service:               &apiregistrationv1.ServiceReference{Namespace: ns, Name: svc.Name, Port: ptr.To[int32](443)},
			Group:                 group,
			Version:               "v1beta1",
			InsecureSkipTLSVerify: true,
			GroupPriorityMinimum:  100,
			VersionPriority:       100,
		},
	}
	if err := c.Create(ctx, apiService); err != nil {
		return nil, fmt.Errorf("creating APIService: %w", err)
	}
	return &MetricsAPI{Service: svc, APIService: apiService}, nil
}

// WorkerServicePort is the guest nodePort the lab's host Services forward to.
const WorkerServicePort = 30080

// HostServiceForWorkers creates a host Service in the cluster's namespace selecting pods by
// selector, forwarding port 80 to the workers' WorkerServicePort.
func HostServiceForWorkers(ctx context.Context, c client.Client, ns, name string, selector map[string]string) (*corev1.Service, error) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(WorkerServicePort)}},
		},
	}
	return svc, c.Create(ctx, svc)
}

func createNamespaces(ctx context.Context, c client.Client, names ...string) error {
	for _, ns := range names {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	return nil
}
