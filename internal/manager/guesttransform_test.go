package manager

import (
	"encoding/json"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// A guest Service keeps what guestnet reads (its spec, guestnet's record, marks and managed
// fields) and loses what a tenant can make large (other annotations, labels, managed fields).
func TestKeepWhatGuestnetReads_Service(t *testing.T) {
	g := NewWithT(t)
	big := strings.Repeat("x", 200_000)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "projectcontour", Name: "envoy",
			Annotations: map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration": big,
				"example.com/huge":                        big,
				guestnetv1.OriginalGuestServiceAnnotation: `{"type":"LoadBalancer"}`,
				ownership.BridgeAnnotation:                "ns/bridge",
			},
			Labels: map[string]string{
				"app.kubernetes.io/name":       "contour",
				"example.com/" + big[:50]:      "v",
				ownership.ManagedByLabel:       ownership.ManagedByValue,
				ownership.BridgeNamespaceLabel: "ns",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm"}, {Manager: ownership.FieldManager, Operation: metav1.ManagedFieldsOperationApply}},
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": "envoy"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080}},
		},
	}
	spec := *svc.Spec.DeepCopy()

	out, err := KeepWhatGuestnetReads(svc)
	g.Expect(err).NotTo(HaveOccurred())
	got := out.(*corev1.Service)
	g.Expect(got.Annotations).To(Equal(map[string]string{
		guestnetv1.OriginalGuestServiceAnnotation: `{"type":"LoadBalancer"}`,
		ownership.BridgeAnnotation:                "ns/bridge",
		DroppedAnnotationsKey:                     "2",
	}))
	g.Expect(got.Labels).To(Equal(map[string]string{ownership.ManagedByLabel: ownership.ManagedByValue, ownership.BridgeNamespaceLabel: "ns"}))
	g.Expect(got.ManagedFields).To(HaveLen(1))
	g.Expect(got.Spec).To(Equal(spec), "the spec is what guestnet reads")

	// Nothing to drop: the object is left as it is.
	plain := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{ownership.BridgeAnnotation: "a/b"}}}
	out, _ = KeepWhatGuestnetReads(plain)
	g.Expect(out.(*corev1.Service).Annotations).To(Equal(map[string]string{ownership.BridgeAnnotation: "a/b"}))
	g.Expect(out.(*corev1.Service).Labels).To(BeNil())
	g.Expect(KeepWhatGuestnetReads("tombstone")).To(Equal("tombstone"))
}

// Webhook configurations keep their labels (a bridge selects them by label) and lose other
// annotations.
func TestKeepWhatGuestnetReads_WebhookConfiguration(t *testing.T) {
	g := NewWithT(t)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{
		Name:        "cert-manager-webhook",
		Labels:      map[string]string{"app.kubernetes.io/instance": "cert-manager"},
		Annotations: map[string]string{"cert-manager.io/inject-ca-from-secret": "cert-manager/ca", "meta.helm.sh/release-name": "cert-manager"},
	}}
	out, err := KeepWhatGuestnetReads(vwc)
	g.Expect(err).NotTo(HaveOccurred())
	got := out.(*admissionregistrationv1.ValidatingWebhookConfiguration)
	g.Expect(got.Labels).To(Equal(map[string]string{"app.kubernetes.io/instance": "cert-manager"}))
	g.Expect(got.Annotations).To(Equal(map[string]string{DroppedAnnotationsKey: "2"}))
}

// The bridge's patch of a cached webhook configuration whose other annotations the cache
// dropped names the record only: it never replaces or removes the whole annotations map,
// which would wipe the annotations the cache does not hold.
func TestKeepWhatGuestnetReads_BridgePatchKeepsOtherAnnotations(t *testing.T) {
	g := NewWithT(t)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "w", ResourceVersion: "7", Annotations: map[string]string{"meta.helm.sh/release-name": "cert-manager"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "w.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{
			Service: &admissionregistrationv1.ServiceReference{Namespace: "cert-manager", Name: "webhook", Port: ptr.To[int32](443)},
		}}},
	}
	out, _ := KeepWhatGuestnetReads(vwc)
	cached := out.(*admissionregistrationv1.ValidatingWebhookConfiguration)

	for _, edit := range []func(*admissionregistrationv1.ValidatingWebhookConfiguration){
		func(o *admissionregistrationv1.ValidatingWebhookConfiguration) { // the record is added
			o.Annotations[guestnetv1.BridgeOriginalAnnotation] = "{}"
		},
	} {
		edited := cached.DeepCopy()
		edit(edited)
		data, err := bridge.GuestPatch(cached, edited)
		g.Expect(err).NotTo(HaveOccurred())
		var ops []map[string]any
		g.Expect(json.Unmarshal(data, &ops)).To(Succeed())
		for _, op := range ops {
			g.Expect(op["path"]).NotTo(Equal("/metadata/annotations"), "a patch of the whole annotations map: %s", data)
		}
	}

	// The record was the only annotation guestnet saw, but not the object's only one.
	withRecord := vwc.DeepCopy()
	withRecord.Annotations[guestnetv1.BridgeOriginalAnnotation] = "{}"
	out, _ = KeepWhatGuestnetReads(withRecord)
	cached = out.(*admissionregistrationv1.ValidatingWebhookConfiguration)
	edited := cached.DeepCopy()
	delete(edited.Annotations, guestnetv1.BridgeOriginalAnnotation)
	data, err := bridge.GuestPatch(cached, edited)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).To(ContainSubstring(`"path":"/metadata/annotations/guestnet.addons.cluster.x-k8s.io~1bridge-original"`))
	g.Expect(string(data)).NotTo(ContainSubstring(`"path":"/metadata/annotations"}`))
}
