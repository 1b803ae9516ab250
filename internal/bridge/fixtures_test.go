package bridge

import (
	"encoding/json"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Fixtures shared by the tests of this package: a bridge, the guest objects of the field
// report (cert-manager's webhooks, metrics-server's APIService) and their Services.

const (
	me    = "k0smotron/bridge" // ownership.BridgeID(newBridge())
	other = "k0smotron/other-bridge"

	cmNS, cmSvc   = "cert-manager", "cert-manager-webhook"
	cmWebhook     = "webhook.cert-manager.io"
	msNS, msSvc   = "kube-system", "metrics-server"
	metricsAPI    = "v1beta1.metrics.k8s.io"
	cmHostService = "tenant-a-cert-manager-cert-manager-webhook"
	msHostService = "tenant-a-kube-system-metrics-server"
	// The URL guestnet writes on cert-manager's validating webhook.
	cmValidateURL = "https://" + cmHostService + ".k0smotron.svc/validate"
)

func newBridge(mutate ...func(*guestnetv1.GuestWebhookBridge)) *guestnetv1.GuestWebhookBridge {
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "bridge", UID: "uid-bridge"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:   "tenant-a",
			NodePortRange: guestnetv1.NodePortRange{Start: 32700, Size: 16},
			Mode:          guestnetv1.BridgeModeAuto,
		},
	}
	for _, m := range mutate {
		m(gwb)
	}
	return gwb
}

func always(gwb *guestnetv1.GuestWebhookBridge) { gwb.Spec.Mode = guestnetv1.BridgeModeAlways }

func whRef(ns, name string, port int32, path string) *admissionregistrationv1.ServiceReference {
	r := &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Path: ptr.To(path)}
	if port != 0 {
		r.Port = ptr.To(port)
	}
	return r
}

func apiRef(ns, name string, port int32) *apiregistrationv1.ServiceReference {
	r := &apiregistrationv1.ServiceReference{Namespace: ns, Name: name}
	if port != 0 {
		r.Port = ptr.To(port)
	}
	return r
}

func vwh(name string, ref *admissionregistrationv1.ServiceReference) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:                    name,
		ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: ref, CABundle: []byte("ca-1")},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		TimeoutSeconds:          ptr.To[int32](10),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}
}

func mwh(name string, ref *admissionregistrationv1.ServiceReference) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name:                    name,
		ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: ref, CABundle: []byte("ca-1")},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}
}

func vwc(name string, labels map[string]string, webhooks ...admissionregistrationv1.ValidatingWebhook) admissionregistrationv1.ValidatingWebhookConfiguration {
	return admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, ResourceVersion: "7"},
		Webhooks:   webhooks,
	}
}

func mwc(name string, labels map[string]string, webhooks ...admissionregistrationv1.MutatingWebhook) admissionregistrationv1.MutatingWebhookConfiguration {
	return admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, ResourceVersion: "7"},
		Webhooks:   webhooks,
	}
}

// certManagerVWC is cert-manager's ValidatingWebhookConfiguration as its chart renders it.
func certManagerVWC() *admissionregistrationv1.ValidatingWebhookConfiguration {
	c := vwc(cmSvc, map[string]string{"app": "webhook"}, vwh(cmWebhook, whRef(cmNS, cmSvc, 443, "/validate")))
	c.Annotations = map[string]string{"cert-manager.io/inject-ca-from-secret": "cert-manager/cert-manager-webhook-ca"}
	return &c
}

// certManagerMWC is cert-manager's MutatingWebhookConfiguration.
func certManagerMWC() *admissionregistrationv1.MutatingWebhookConfiguration {
	c := mwc(cmSvc, map[string]string{"app": "webhook"}, mwh(cmWebhook, whRef(cmNS, cmSvc, 0, "/mutate")))
	return &c
}

func apiService(name string, ref *apiregistrationv1.ServiceReference, available ...apiregistrationv1.ConditionStatus) *apiregistrationv1.APIService {
	a := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "3"},
		Spec: apiregistrationv1.APIServiceSpec{
			Service: ref, Group: "metrics.k8s.io", Version: "v1beta1",
			GroupPriorityMinimum: 100, VersionPriority: 100,
		},
	}
	for _, s := range available {
		reason := "Passed"
		if s == apiregistrationv1.ConditionFalse {
			reason = "FailedDiscoveryCheck"
		}
		a.Status.Conditions = append(a.Status.Conditions, apiregistrationv1.APIServiceCondition{
			Type: apiregistrationv1.Available, Status: s, Reason: reason,
		})
	}
	return a
}

// metricsAPIService is metrics-server's APIService as its chart renders it (insecure by
// default), failing its discovery check because the guest apiserver cannot reach it.
func metricsAPIService() *apiregistrationv1.APIService {
	a := apiService(metricsAPI, apiRef(msNS, msSvc, 443), apiregistrationv1.ConditionFalse)
	a.Spec.InsecureSkipTLSVerify = true
	return a
}

// chartService is a chart's ClusterIP Service selecting app=<name>, one TCP port each.
func chartService(ns, name string, ports ...int32) corev1.Service {
	svc := corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: "10.96.0.10",
			Selector:  map[string]string{"app": name},
		},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: "https", Port: p, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("https"),
		})
	}
	if len(svc.Spec.Ports) > 1 {
		for i := range svc.Spec.Ports {
			svc.Spec.Ports[i].Name = ""
		}
	}
	return svc
}

// nodePortService is a guest NodePort Service of someone else's, holding nodePorts.
func nodePortService(ns, name string, nodePorts ...int32) corev1.Service {
	svc := corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": name}},
	}
	for i, n := range nodePorts {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Port: int32(80 + i), NodePort: n, Protocol: corev1.ProtocolTCP})
	}
	return svc
}

func defaultGuestServices() []corev1.Service {
	return []corev1.Service{
		chartService(cmNS, cmSvc, 443),
		chartService(msNS, msSvc, 443),
	}
}

// toService renders an apply configuration as the Service it asks for.
func toService(t *testing.T, ac *corev1ac.ServiceApplyConfiguration) corev1.Service {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ac)
	if err != nil {
		t.Fatal(err)
	}
	svc := corev1.Service{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, &svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

// record builds the record guestnet writes, for hand-made targets.
func record(t *testing.T, bridge string, original any, written string) *Record {
	t.Helper()
	raw, err := json.Marshal(original)
	if err != nil {
		t.Fatal(err)
	}
	return &Record{Bridge: bridge, Original: raw, Written: written}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
