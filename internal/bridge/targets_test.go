package bridge

import (
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// selectionGuest is a guest with objects of every sort Select must tell apart.
func selectionGuest(t *testing.T) Observed {
	t.Helper()
	customMetrics := apiService("v1beta1.custom.metrics.k8s.io", apiRef("monitoring", "prometheus-adapter", 443), apiregistrationv1.ConditionTrue)
	customMetrics.Labels = map[string]string{"app": "prometheus-adapter"}
	// Served by the guest apiserver itself: no service.
	apps := apiService("v1.apps", nil, apiregistrationv1.ConditionTrue)
	// guestnet's record, but its service was taken away since (local now): still guestnet's
	// to clean up, so "all" selects it.
	recorded := apiService("v1.recorded.example.io", nil)
	recorded.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: mustJSON(t, map[string]Record{
		"v1.recorded.example.io": *record(t, me, apiRef("example", "api", 443), "example/api-guestnet:443"),
	})}

	kyverno := vwc("kyverno-resource-validating-webhook-cfg", map[string]string{"app.kubernetes.io/part-of": "kyverno"},
		vwh("validate.kyverno.svc-fail", whRef("kyverno", "kyverno-svc", 443, "/validate/fail")),
		vwh("validate.kyverno.svc-ignore", whRef("kyverno", "kyverno-svc", 443, "/validate/ignore")),
	)
	urlOnly := vwc("external-webhook", nil, vwh("external.example.com", nil))
	urlOnly.Webhooks[0].ClientConfig.URL = ptr.To("https://webhook.example.com/validate")
	// guestnet rewrote it: it has a url now, and guestnet's record.
	rewritten := vwc("rewritten-webhook", nil, vwh("rewritten.example.com", nil))
	rewritten.Webhooks[0].ClientConfig.URL = ptr.To("https://tenant-a-x-y.k0smotron.svc/")
	rewritten.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: mustJSON(t, map[string]Record{
		"rewritten.example.com": *record(t, me, whRef("x", "y", 443, "/"), "https://tenant-a-x-y.k0smotron.svc/"),
	})}
	// One webhook references a Service, the other has a url: the configuration references a Service.
	mixed := vwc("mixed-webhook", nil, vwh("a.mixed.example.com", nil), vwh("b.mixed.example.com", whRef("mixed", "svc", 8443, "")))
	mixed.Webhooks[0].ClientConfig.URL = ptr.To("https://mixed.example.com/")

	return Observed{
		APIServices: []apiregistrationv1.APIService{*metricsAPIService(), *customMetrics, *apps, *recorded},
		ValidatingWebhooks: []admissionregistrationv1.ValidatingWebhookConfiguration{
			*certManagerVWC(), kyverno, urlOnly, rewritten, mixed,
		},
		MutatingWebhooks: []admissionregistrationv1.MutatingWebhookConfiguration{
			*certManagerMWC(),
			mwc("kyverno-resource-mutating-webhook-cfg", map[string]string{"app.kubernetes.io/part-of": "kyverno"},
				mwh("mutate.kyverno.svc-fail", whRef("kyverno", "kyverno-svc", 443, "/mutate/fail"))),
		},
	}
}

func TestSelect(t *testing.T) {
	kyvernoSelector := &guestnetv1.TargetLabelSelector{MatchLabels: map[string]guestnetv1.LabelValue{"app.kubernetes.io/part-of": "kyverno"}}
	tests := []struct {
		name     string
		spec     guestnetv1.GuestWebhookBridgeSpec
		wantKeys []string
		// wantMissing are the keys of Found=false targets.
		wantMissing []string
	}{
		{name: "nothing selected"},
		{
			name: "by names, one of them missing in the guest",
			spec: guestnetv1.GuestWebhookBridgeSpec{
				APIServices:        &guestnetv1.TargetSelector{Names: []string{metricsAPI, "v1beta1.missing.example.io"}},
				ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{cmSvc}},
				MutatingWebhooks:   &guestnetv1.TargetSelector{Names: []string{"not-installed-yet"}},
			},
			wantKeys: []string{
				"APIService/v1beta1.metrics.k8s.io",
				"APIService/v1beta1.missing.example.io",
				"MutatingWebhookConfiguration/not-installed-yet",
				"ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io",
			},
			wantMissing: []string{"APIService/v1beta1.missing.example.io", "MutatingWebhookConfiguration/not-installed-yet"},
		},
		{
			name: "a name selects an object even when it references no Service",
			spec: guestnetv1.GuestWebhookBridgeSpec{
				APIServices:        &guestnetv1.TargetSelector{Names: []string{"v1.apps"}},
				ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{"external-webhook"}},
			},
			wantKeys: []string{"APIService/v1.apps", "ValidatingWebhookConfiguration/external-webhook/external.example.com"},
		},
		{
			name: "by label selector: every webhook of each matching configuration",
			spec: guestnetv1.GuestWebhookBridgeSpec{
				APIServices:        &guestnetv1.TargetSelector{Selector: &guestnetv1.TargetLabelSelector{MatchLabels: map[string]guestnetv1.LabelValue{"app": "prometheus-adapter"}}},
				ValidatingWebhooks: &guestnetv1.TargetSelector{Selector: kyvernoSelector},
				MutatingWebhooks:   &guestnetv1.TargetSelector{Selector: kyvernoSelector},
			},
			wantKeys: []string{
				"APIService/v1beta1.custom.metrics.k8s.io",
				"MutatingWebhookConfiguration/kyverno-resource-mutating-webhook-cfg/mutate.kyverno.svc-fail",
				"ValidatingWebhookConfiguration/kyverno-resource-validating-webhook-cfg/validate.kyverno.svc-fail",
				"ValidatingWebhookConfiguration/kyverno-resource-validating-webhook-cfg/validate.kyverno.svc-ignore",
			},
		},
		{
			name: "by set-based selector",
			spec: guestnetv1.GuestWebhookBridgeSpec{
				ValidatingWebhooks: &guestnetv1.TargetSelector{Selector: &guestnetv1.TargetLabelSelector{MatchExpressions: []guestnetv1.TargetLabelSelectorRequirement{
					{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"webhook", "other"}},
				}}},
			},
			wantKeys: []string{"ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io"},
		},
		{
			name: "all: objects that reference a Service, and those guestnet rewrote",
			spec: guestnetv1.GuestWebhookBridgeSpec{
				APIServices:        &guestnetv1.TargetSelector{All: true},
				ValidatingWebhooks: &guestnetv1.TargetSelector{All: true},
				MutatingWebhooks:   &guestnetv1.TargetSelector{All: true},
			},
			wantKeys: []string{
				"APIService/v1.recorded.example.io",
				"APIService/v1beta1.custom.metrics.k8s.io",
				"APIService/v1beta1.metrics.k8s.io",
				"MutatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io",
				"MutatingWebhookConfiguration/kyverno-resource-mutating-webhook-cfg/mutate.kyverno.svc-fail",
				"ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io",
				"ValidatingWebhookConfiguration/kyverno-resource-validating-webhook-cfg/validate.kyverno.svc-fail",
				"ValidatingWebhookConfiguration/kyverno-resource-validating-webhook-cfg/validate.kyverno.svc-ignore",
				// A configuration contributes all its webhooks, the url one too.
				"ValidatingWebhookConfiguration/mixed-webhook/a.mixed.example.com",
				"ValidatingWebhookConfiguration/mixed-webhook/b.mixed.example.com",
				"ValidatingWebhookConfiguration/rewritten-webhook/rewritten.example.com",
			},
		},
		{
			name: "all for one kind only",
			spec: guestnetv1.GuestWebhookBridgeSpec{MutatingWebhooks: &guestnetv1.TargetSelector{All: true}},
			wantKeys: []string{
				"MutatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io",
				"MutatingWebhookConfiguration/kyverno-resource-mutating-webhook-cfg/mutate.kyverno.svc-fail",
			},
		},
		{
			name: "names, selector and all add up without duplicates",
			spec: guestnetv1.GuestWebhookBridgeSpec{
				ValidatingWebhooks: &guestnetv1.TargetSelector{
					Names:    []string{cmSvc, "kyverno-resource-validating-webhook-cfg", "gone"},
					Selector: kyvernoSelector,
				},
			},
			wantKeys: []string{
				"ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io",
				"ValidatingWebhookConfiguration/gone",
				"ValidatingWebhookConfiguration/kyverno-resource-validating-webhook-cfg/validate.kyverno.svc-fail",
				"ValidatingWebhookConfiguration/kyverno-resource-validating-webhook-cfg/validate.kyverno.svc-ignore",
			},
			wantMissing: []string{"ValidatingWebhookConfiguration/gone"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			targets, err := Select(&tt.spec, selectionGuest(t), HostRecords{})
			g.Expect(err).NotTo(HaveOccurred())

			var keys, missing []string
			for _, tg := range targets {
				keys = append(keys, tg.Key())
				if !tg.Found {
					missing = append(missing, tg.Key())
					g.Expect(tg.Service).To(BeNil())
					g.Expect(tg.Webhook).To(BeEmpty())
				}
			}
			g.Expect(keys).To(Equal(tt.wantKeys))
			g.Expect(slices.IsSorted(keys)).To(BeTrue(), "targets are sorted by key")
			g.Expect(missing).To(Equal(tt.wantMissing))
		})
	}
}

func TestSelectInvalidSelector(t *testing.T) {
	bad := &guestnetv1.TargetLabelSelector{MatchExpressions: []guestnetv1.TargetLabelSelectorRequirement{
		{Key: "app", Operator: "Sometimes", Values: []string{"x"}},
	}}
	for _, spec := range []guestnetv1.GuestWebhookBridgeSpec{
		{APIServices: &guestnetv1.TargetSelector{Selector: bad}},
		{ValidatingWebhooks: &guestnetv1.TargetSelector{Selector: bad}},
		{MutatingWebhooks: &guestnetv1.TargetSelector{Selector: bad}},
	} {
		g := NewWithT(t)
		_, err := Select(&spec, selectionGuest(t), HostRecords{})
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring("selector"))
	}
}

// A record annotation that cannot be read does not stop the selection: only the targets it
// was for carry the error, each on its own (a damaged entry, or an annotation that is not
// JSON at all).
func TestSelectUnreadableRecord(t *testing.T) {
	g := NewWithT(t)
	obs := selectionGuest(t)
	obs.ValidatingWebhooks[0].Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: "not json"}
	targets, err := Select(&guestnetv1.GuestWebhookBridgeSpec{ValidatingWebhooks: &guestnetv1.TargetSelector{All: true}}, obs, HostRecords{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(targets).NotTo(BeEmpty())
	for _, tg := range targets {
		if tg.Name == cmSvc {
			g.Expect(tg.RecordErr).To(MatchError(ContainSubstring("is not guestnet's JSON")), tg.Key())
		} else {
			g.Expect(tg.RecordErr).NotTo(HaveOccurred(), tg.Key())
		}
	}

	obs = selectionGuest(t)
	obs.APIServices[0].Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: `{"` + metricsAPI + `": {"bridge": "k0smotron/bridge", "original": "nope", "written": "x"}}`}
	targets, err = Select(&guestnetv1.GuestWebhookBridgeSpec{APIServices: &guestnetv1.TargetSelector{Names: []string{metricsAPI}}}, obs, HostRecords{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(targets).To(HaveLen(1))
	g.Expect(targets[0].Record).To(BeNil())
	g.Expect(targets[0].RecordErr).To(MatchError(ContainSubstring("its original is not a service reference")))
}

func TestAPIServiceTarget(t *testing.T) {
	tests := []struct {
		name string
		api  *apiregistrationv1.APIService
		want Target
	}{
		{
			name: "metrics-server: insecure, failing its discovery check",
			api:  metricsAPIService(),
			want: Target{
				Kind: guestnetv1.APIServiceTarget, Name: metricsAPI, Found: true,
				Service:               &ServiceRef{Namespace: msNS, Name: msSvc, Port: 443},
				InsecureSkipTLSVerify: true,
				Available:             &apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionFalse, Reason: "FailedDiscoveryCheck"},
			},
		},
		{
			name: "port defaults to 443, caBundle, no condition yet",
			api: func() *apiregistrationv1.APIService {
				a := apiService("v1beta1.custom.metrics.k8s.io", apiRef("monitoring", "adapter", 0))
				a.Spec.CABundle = []byte("pem")
				return a
			}(),
			want: Target{
				Kind: guestnetv1.APIServiceTarget, Name: "v1beta1.custom.metrics.k8s.io", Found: true,
				Service: &ServiceRef{Namespace: "monitoring", Name: "adapter", Port: 443}, CABundle: []byte("pem"),
			},
		},
		{
			name: "served by the apiserver itself",
			api:  apiService("v1.apps", nil, apiregistrationv1.ConditionTrue),
			want: Target{
				Kind: guestnetv1.APIServiceTarget, Name: "v1.apps", Found: true,
				Available: &apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue, Reason: "Passed"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			got := APIServiceTarget(tt.api)
			if tt.api.Spec.Service != nil {
				g.Expect(string(got.original)).To(MatchJSON(mustJSON(t, tt.api.Spec.Service)))
			}
			got.original = nil
			g.Expect(got).To(Equal(tt.want))
		})
	}

	t.Run("record of another object's name is not this one's", func(t *testing.T) {
		g := NewWithT(t)
		a := metricsAPIService()
		a.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: mustJSON(t, map[string]Record{
			"v1beta1.other.k8s.io": *record(t, me, apiRef(msNS, msSvc, 443), "x"),
		})}
		got := APIServiceTarget(a)
		g.Expect(got.Record).To(BeNil())

		a.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: mustJSON(t, map[string]Record{
			metricsAPI: *record(t, me, apiRef(msNS, msSvc, 443), "kube-system/metrics-server-guestnet:443"),
		})}
		got = APIServiceTarget(a)
		g.Expect(got.Record).NotTo(BeNil())
		g.Expect(got.Record.Bridge).To(Equal(me))
		g.Expect(got.Record.Written).To(Equal("kube-system/metrics-server-guestnet:443"))
	})
}

func TestWebhookTargets(t *testing.T) {
	g := NewWithT(t)
	c := vwc("kyverno", nil,
		vwh("a.kyverno.svc", whRef("kyverno", "kyverno-svc", 0, "/validate")),
		vwh("b.kyverno.svc", nil),
	)
	c.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
	c.Webhooks[0].TimeoutSeconds = ptr.To[int32](5)
	c.Webhooks[1].ClientConfig.URL = ptr.To("https://10.0.0.1:30443/validate")
	c.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: mustJSON(t, map[string]Record{
		"b.kyverno.svc": *record(t, other, whRef("kyverno", "kyverno-svc", 443, "/b"), "https://10.0.0.1:30443/validate"),
	})}

	targets := WebhookTargets(&c)
	g.Expect(targets).To(HaveLen(2))

	a := targets[0]
	g.Expect(a.Kind).To(Equal(guestnetv1.ValidatingWebhookTarget))
	g.Expect(a.Key()).To(Equal("ValidatingWebhookConfiguration/kyverno/a.kyverno.svc"))
	g.Expect(a.Found).To(BeTrue())
	g.Expect(a.Service).To(Equal(&ServiceRef{Namespace: "kyverno", Name: "kyverno-svc", Port: 443, Path: "/validate"}), "port defaults to 443")
	g.Expect(a.URL).To(BeEmpty())
	g.Expect(a.CABundle).To(Equal([]byte("ca-1")))
	g.Expect(*a.FailurePolicy).To(Equal(admissionregistrationv1.Ignore))
	g.Expect(*a.TimeoutSeconds).To(Equal(int32(5)))
	g.Expect(a.Record).To(BeNil())

	b := targets[1]
	g.Expect(b.Service).To(BeNil())
	g.Expect(b.URL).To(Equal("https://10.0.0.1:30443/validate"))
	g.Expect(b.Record).NotTo(BeNil())
	g.Expect(b.Record.Bridge).To(Equal(other))

	m := certManagerMWC()
	mt := WebhookTargets(m)
	g.Expect(mt).To(HaveLen(1))
	g.Expect(mt[0].Kind).To(Equal(guestnetv1.MutatingWebhookTarget))
	g.Expect(mt[0].IsWebhook()).To(BeTrue())
	g.Expect(mt[0].Service.Path).To(Equal("/mutate"))
}

func TestTargetNaming(t *testing.T) {
	tests := []struct {
		target              Target
		wantKey, wantString string
		wantWebhook         bool
	}{
		{
			target:  Target{Kind: guestnetv1.APIServiceTarget, Name: metricsAPI},
			wantKey: "APIService/v1beta1.metrics.k8s.io", wantString: "APIService v1beta1.metrics.k8s.io",
		},
		{
			target:      Target{Kind: guestnetv1.ValidatingWebhookTarget, Name: cmSvc, Webhook: cmWebhook},
			wantKey:     "ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io",
			wantString:  "ValidatingWebhookConfiguration cert-manager-webhook, webhook webhook.cert-manager.io",
			wantWebhook: true,
		},
		{
			target:  Target{Kind: guestnetv1.MutatingWebhookTarget, Name: "missing"},
			wantKey: "MutatingWebhookConfiguration/missing", wantString: "MutatingWebhookConfiguration missing", wantWebhook: true,
		},
	}
	for _, tt := range tests {
		g := NewWithT(t)
		g.Expect(tt.target.Key()).To(Equal(tt.wantKey))
		g.Expect(tt.target.String()).To(Equal(tt.wantString))
		g.Expect(tt.target.IsWebhook()).To(Equal(tt.wantWebhook))
	}
	g := NewWithT(t)
	g.Expect(ServiceRef{Namespace: "a", Name: "b", Port: 8443, Path: "/x"}.String()).To(Equal("a/b:8443"))
}
