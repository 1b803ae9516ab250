package bridge

import (
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// withFutureFields is the JSON of obj as a newer guest apiserver would serve it: with fields
// guestnet's v0.37 typed structs do not have, at the object, webhook and clientConfig level.
func withFutureFields(g Gomega, obj client.Object) []byte {
	raw, err := json.Marshal(obj)
	g.Expect(err).NotTo(HaveOccurred())
	var doc map[string]any
	g.Expect(json.Unmarshal(raw, &doc)).To(Succeed())
	doc["futureTopLevel"] = map[string]any{"enabled": true}
	if webhooks, ok := doc["webhooks"].([]any); ok {
		for _, w := range webhooks {
			w := w.(map[string]any)
			w["futurePolicy"] = "Strict"
			w["clientConfig"].(map[string]any)["futureTransport"] = map[string]any{"http2": false}
		}
	}
	if spec, ok := doc["spec"].(map[string]any); ok {
		spec["futureRouting"] = "Endpoints"
	}
	out, err := json.Marshal(doc)
	g.Expect(err).NotTo(HaveOccurred())
	return out
}

// decode is what guestnet's client makes of served JSON: its typed struct (unknown fields
// dropped).
func decode[T any](g Gomega, raw []byte) *T {
	obj := new(T)
	g.Expect(json.Unmarshal(raw, obj)).To(Succeed())
	return obj
}

func patchRaw(g Gomega, raw, patch []byte) []byte {
	p, err := jsonpatch.DecodePatch(patch)
	g.Expect(err).NotTo(HaveOccurred())
	out, err := p.Apply(raw)
	g.Expect(err).NotTo(HaveOccurred(), "patch %s", patch)
	return out
}

// The patch of a rewrite and of a restore, applied by the apiserver's JSON patch library to
// an object that carries fields guestnet's typed structs do not know, leaves them as they
// are; rewrite and restore give back the served object exactly. A full update from the
// typed struct would have dropped them: that is what guestnet no longer sends.
func TestGuestPatchKeepsUnknownFields(t *testing.T) {
	g := NewWithT(t)
	chart := certManagerVWC()
	chart.ResourceVersion = "7"
	served := withFutureFields(g, chart)

	// Rewrite, from what guestnet's client reads.
	observed := decode[admissionregistrationv1.ValidatingWebhookConfiguration](g, served)
	edited := observed.DeepCopy()
	_, err := RewriteWebhook(edited, cmWebhook, cmValidateURL, NewRecord(WebhookTargets(observed)[0], me, cmValidateURL))
	g.Expect(err).NotTo(HaveOccurred())
	patch, err := GuestPatch(observed, edited)
	g.Expect(err).NotTo(HaveOccurred())
	rewritten := patchRaw(g, served, patch)

	var doc map[string]any
	g.Expect(json.Unmarshal(rewritten, &doc)).To(Succeed())
	webhook := doc["webhooks"].([]any)[0].(map[string]any)
	cc := webhook["clientConfig"].(map[string]any)
	g.Expect(doc).To(HaveKeyWithValue("futureTopLevel", map[string]any{"enabled": true}))
	g.Expect(webhook).To(HaveKeyWithValue("futurePolicy", "Strict"))
	g.Expect(cc).To(HaveKeyWithValue("futureTransport", map[string]any{"http2": false}))
	g.Expect(cc).To(HaveKeyWithValue("url", cmValidateURL))
	g.Expect(cc).NotTo(HaveKey("service"))
	g.Expect(doc["metadata"].(map[string]any)["annotations"]).To(HaveKey(guestnetv1.BridgeOriginalAnnotation))

	// Restore, from what guestnet's client reads of the rewritten object.
	observed = decode[admissionregistrationv1.ValidatingWebhookConfiguration](g, rewritten)
	edited = observed.DeepCopy()
	_, err = RestoreWebhook(edited, cmWebhook, *WebhookTargets(observed)[0].Record)
	g.Expect(err).NotTo(HaveOccurred())
	patch, err = GuestPatch(observed, edited)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(patchRaw(g, rewritten, patch))).To(MatchJSON(served), "the served object, unknown fields and all")

	// What a full update sends instead: the typed struct, without the unknown fields.
	typed, err := json.Marshal(decode[admissionregistrationv1.ValidatingWebhookConfiguration](g, served))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(typed)).NotTo(ContainSubstring("future"))
}

func TestGuestPatchKeepsUnknownFieldsOfAnAPIService(t *testing.T) {
	g := NewWithT(t)
	chart := metricsAPIService()
	chart.ResourceVersion = "3"
	served := withFutureFields(g, chart)
	ref := apiregistrationv1.ServiceReference{Namespace: msNS, Name: "metrics-server-guestnet", Port: ptr.To[int32](443)}

	observed := decode[apiregistrationv1.APIService](g, served)
	edited := observed.DeepCopy()
	_, err := RewriteAPIService(edited, ref, NewRecord(APIServiceTarget(observed), me, "kube-system/metrics-server-guestnet:443"))
	g.Expect(err).NotTo(HaveOccurred())
	patch, err := GuestPatch(observed, edited)
	g.Expect(err).NotTo(HaveOccurred())
	rewritten := patchRaw(g, served, patch)
	g.Expect(string(rewritten)).To(ContainSubstring(`"futureRouting":"Endpoints"`))

	observed = decode[apiregistrationv1.APIService](g, rewritten)
	edited = observed.DeepCopy()
	_, err = RestoreAPIService(edited, *APIServiceTarget(observed).Record)
	g.Expect(err).NotTo(HaveOccurred())
	patch, err = GuestPatch(observed, edited)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(patchRaw(g, rewritten, patch))).To(MatchJSON(served))
}

func TestGuestPatch(t *testing.T) {
	g := NewWithT(t)
	observed := certManagerVWC()
	observed.ResourceVersion = "7"

	t.Run("nothing changed: no patch", func(t *testing.T) {
		patch, err := GuestPatch(observed, observed.DeepCopy())
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		NewWithT(t).Expect(patch).To(BeNil())
	})

	t.Run("guarded by the resourceVersion read", func(t *testing.T) {
		g := NewWithT(t)
		edited := observed.DeepCopy()
		_, err := RewriteWebhook(edited, cmWebhook, cmValidateURL, NewRecord(WebhookTargets(observed)[0], me, cmValidateURL))
		g.Expect(err).NotTo(HaveOccurred())
		patch, err := GuestPatch(observed, edited)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(patch)).To(HavePrefix(`[{"op":"replace","path":"/metadata/resourceVersion","value":"7"}`))
		noRV := observed.DeepCopy()
		noRV.ResourceVersion = ""
		_, err = GuestPatch(noRV, edited)
		g.Expect(err).To(HaveOccurred())
	})

	t.Run("a change of a field guestnet does not own is refused", func(t *testing.T) {
		g := NewWithT(t)
		edited := observed.DeepCopy()
		edited.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		_, err := GuestPatch(observed, edited)
		g.Expect(err).To(MatchError(ContainSubstring("changes fields guestnet does not own")))
		edited = observed.DeepCopy()
		edited.Webhooks[0].ClientConfig.CABundle = []byte("ca-2")
		_, err = GuestPatch(observed, edited)
		g.Expect(err).To(HaveOccurred(), "caBundle is cainjector's")
		edited = observed.DeepCopy()
		edited.Annotations["meta.helm.sh/release-name"] = "x"
		_, err = GuestPatch(observed, edited)
		g.Expect(err).To(HaveOccurred())
	})
	_ = g
}
