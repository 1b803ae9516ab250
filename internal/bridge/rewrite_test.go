package bridge

import (
	"encoding/json"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// expectSameObject checks that got is want, field by field and byte by byte as the
// apiserver would receive it.
func expectSameObject(g Gomega, got, want any) {
	g.Expect(got).To(Equal(want))
	gotJSON, err := json.Marshal(got)
	g.Expect(err).NotTo(HaveOccurred())
	wantJSON, err := json.Marshal(want)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(gotJSON)).To(Equal(string(wantJSON)))
}

// records reads guestnet's records from an object, failing on an unreadable annotation.
func records(g Gomega, obj client.Object) map[string]Record {
	set := readRecordSet(obj)
	g.Expect(set.unreadable).NotTo(HaveOccurred())
	out := map[string]Record{}
	for key := range set.entries {
		r, err := set.get(key)
		g.Expect(err).NotTo(HaveOccurred())
		out[key] = *r
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// The plan decides which record a rewrite stores; these do what it does with the guest copy
// alone: a first rewrite records the service the target holds; a target that holds what the
// bridge wrote keeps its recorded original.

func rewriteWebhook(obj client.Object, webhook, url, bridge string) (bool, error) {
	t := Target{Webhook: webhook, Service: &ServiceRef{}} // a webhook the object lacks: RewriteWebhook says so
	for _, tg := range WebhookTargets(obj) {
		if tg.Webhook == webhook {
			t = tg
		}
	}
	rec := NewRecord(t, bridge, url)
	if t.Service == nil {
		if t.Record == nil || t.Record.Bridge != bridge {
			return false, fmt.Errorf("%s webhook %s references no Service and was not rewritten by %s", obj.GetName(), webhook, bridge)
		}
		rec.Original = t.Record.Original
	}
	return RewriteWebhook(obj, webhook, url, rec)
}

func restoreWebhook(obj client.Object, webhook, bridge string) (bool, error) {
	r, err := readRecordSet(obj).get(webhook)
	if err != nil || r == nil || r.Bridge != bridge {
		return false, nil
	}
	return RestoreWebhook(obj, webhook, *r)
}

func rewriteAPIService(a *apiregistrationv1.APIService, ref apiregistrationv1.ServiceReference, bridge string) (bool, error) {
	t := APIServiceTarget(a)
	written := ServiceRef{Namespace: ref.Namespace, Name: ref.Name, Port: ptr.Deref(ref.Port, 443)}.String()
	rec := NewRecord(t, bridge, written)
	switch {
	case t.Record != nil && t.Record.Bridge == bridge && holds(t, t.Record):
		rec.Original = t.Record.Original
	case t.Service == nil:
		return false, fmt.Errorf("APIService %s references no Service", a.Name)
	}
	return RewriteAPIService(a, ref, rec)
}

func restoreAPIService(a *apiregistrationv1.APIService, bridge string) (bool, error) {
	t := APIServiceTarget(a)
	if t.Record == nil || t.Record.Bridge != bridge {
		return false, nil
	}
	return RestoreAPIService(a, *t.Record)
}

// clientConfig is the client config of the webhook named name, for any configuration kind.
func clientConfig(g Gomega, obj client.Object, name string) *admissionregistrationv1.WebhookClientConfig {
	w, ok := findWebhook(obj, name)
	g.Expect(ok).To(BeTrue(), "webhook %s", name)
	return w.config
}

func TestRewriteRestoreWebhookRoundTrip(t *testing.T) {
	const url = cmValidateURL
	tests := []struct {
		name    string
		obj     func() client.Object
		webhook string
	}{
		{name: "cert-manager's validating webhook", obj: func() client.Object { return certManagerVWC() }, webhook: cmWebhook},
		{
			name: "no annotations at all",
			obj: func() client.Object {
				c := certManagerVWC()
				c.Annotations = nil
				return c
			},
			webhook: cmWebhook,
		},
		{name: "mutating, port and path as the chart left them", obj: func() client.Object { return certManagerMWC() }, webhook: cmWebhook},
		{
			name: "second webhook of a configuration, the first is left alone",
			obj: func() client.Object {
				c := vwc("kyverno", nil,
					vwh("a.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/a")),
					vwh("b.kyverno.svc", &admissionregistrationv1.ServiceReference{Namespace: "kyverno", Name: "kyverno-svc"}))
				return &c
			},
			webhook: "b.kyverno.svc",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			original := tt.obj()
			obj := original.DeepCopyObject().(client.Object)
			originalService := clientConfig(g, original, tt.webhook).Service

			changed, err := rewriteWebhook(obj, tt.webhook, url, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeTrue())
			cc := clientConfig(g, obj, tt.webhook)
			g.Expect(cc.Service).To(BeNil(), "url and service together are rejected")
			g.Expect(cc.URL).To(Equal(ptr.To(url)))
			g.Expect(cc.CABundle).To(Equal([]byte("ca-1")), "caBundle is cainjector's")
			rec := records(g, obj)
			g.Expect(rec).To(HaveLen(1))
			g.Expect(rec[tt.webhook].Bridge).To(Equal(me))
			g.Expect(rec[tt.webhook].Written).To(Equal(url))
			g.Expect(string(rec[tt.webhook].Original)).To(MatchJSON(mustJSON(t, originalService)))
			for k, v := range original.GetAnnotations() {
				g.Expect(obj.GetAnnotations()).To(HaveKeyWithValue(k, v), "other annotations stay")
			}
			// Everything else is as it was.
			for _, w := range webhooksOf(original) {
				if w.name != tt.webhook {
					g.Expect(clientConfig(g, obj, w.name)).To(Equal(w.config))
				}
			}

			// The same rewrite again changes nothing.
			rewritten := obj.DeepCopyObject()
			changed, err = rewriteWebhook(obj, tt.webhook, url, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeFalse())
			g.Expect(obj).To(Equal(rewritten))

			// cert-manager's cainjector rotates the CA in between.
			clientConfig(g, obj, tt.webhook).CABundle = []byte("ca-2")

			changed, err = restoreWebhook(obj, tt.webhook, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeTrue())
			want := original.DeepCopyObject().(client.Object)
			clientConfig(g, want, tt.webhook).CABundle = []byte("ca-2")
			g.Expect(obj.GetAnnotations()).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
			expectSameObject(g, obj, want)

			// Restoring again changes nothing.
			changed, err = restoreWebhook(obj, tt.webhook, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeFalse())
			expectSameObject(g, obj, want)
		})
	}
}

func TestRewriteWebhook(t *testing.T) {
	const (
		url    = cmValidateURL
		newURL = "https://" + cmHostService + ".k0smotron.svc:8443/validate"
	)
	withURL := func(c *admissionregistrationv1.ValidatingWebhookConfiguration, u string) {
		c.Webhooks[0].ClientConfig.Service = nil
		c.Webhooks[0].ClientConfig.URL = ptr.To(u)
	}
	rewritten := func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
		c := certManagerVWC()
		if _, err := rewriteWebhook(c, cmWebhook, url, me); err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		name         string
		obj          func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration
		webhook, url string
		wantErr      string
		wantChanged  bool
		// wantOriginal is the service the record holds afterwards.
		wantOriginal *admissionregistrationv1.ServiceReference
	}{
		{
			name: "no such webhook", obj: func(*testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration { return certManagerVWC() },
			webhook: "other.cert-manager.io", url: url, wantErr: "has no webhook other.cert-manager.io",
		},
		{
			name: "a url of someone else's",
			obj: func(*testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := certManagerVWC()
				withURL(c, "https://10.2.0.5:30443/validate")
				return c
			},
			webhook: cmWebhook, url: url, wantErr: "references no Service and was not rewritten by " + me,
		},
		{
			name: "a url another bridge wrote",
			obj: func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := certManagerVWC()
				if _, err := rewriteWebhook(c, cmWebhook, url, other); err != nil {
					t.Fatal(err)
				}
				return c
			},
			webhook: cmWebhook, url: url, wantErr: "was not rewritten by " + me,
		},
		{
			name: "same url again: nothing to do", obj: rewritten, webhook: cmWebhook, url: url,
			wantOriginal: whRef(cmNS, cmSvc, 443, "/validate"),
		},
		{
			name: "another url (the bridge moved): the original stays", obj: rewritten, webhook: cmWebhook, url: newURL,
			wantChanged: true, wantOriginal: whRef(cmNS, cmSvc, 443, "/validate"),
		},
		{
			// helm upgrade puts the service back and keeps unknown annotations: the chart's
			// service is the new original.
			name: "Helm revert, record still there: the new original is recorded",
			obj: func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := rewritten(t)
				c.Webhooks[0].ClientConfig.URL = nil
				c.Webhooks[0].ClientConfig.Service = whRef(cmNS, cmSvc, 443, "/validate-v2")
				return c
			},
			webhook: cmWebhook, url: url, wantChanged: true, wantOriginal: whRef(cmNS, cmSvc, 443, "/validate-v2"),
		},
		{
			name: "Helm revert, record gone too",
			obj: func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := rewritten(t)
				c.Webhooks[0].ClientConfig.URL = nil
				c.Webhooks[0].ClientConfig.Service = whRef(cmNS, cmSvc, 10250, "/validate-v2")
				delete(c.Annotations, guestnetv1.BridgeOriginalAnnotation)
				return c
			},
			webhook: cmWebhook, url: url, wantChanged: true, wantOriginal: whRef(cmNS, cmSvc, 10250, "/validate-v2"),
		},
		{
			name: "the url is ours but the record says otherwise: rewritten",
			obj: func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := rewritten(t)
				withURL(c, "https://somewhere.else/")
				return c
			},
			webhook: cmWebhook, url: url, wantChanged: true, wantOriginal: whRef(cmNS, cmSvc, 443, "/validate"),
		},
		{
			// Nothing in it can be read: it is replaced (every bridge keeps its records in
			// its own host copy too).
			name: "unreadable record annotation replaced",
			obj: func(*testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := certManagerVWC()
				c.Annotations[guestnetv1.BridgeOriginalAnnotation] = "{"
				return c
			},
			webhook: cmWebhook, url: url, wantChanged: true, wantOriginal: whRef(cmNS, cmSvc, 443, "/validate"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := tt.obj(t)
			before := obj.DeepCopy()
			changed, err := rewriteWebhook(obj, tt.webhook, tt.url, me)
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				g.Expect(changed).To(BeFalse())
				g.Expect(obj).To(Equal(before), "an error changes nothing")
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(Equal(tt.wantChanged))
			if !changed {
				g.Expect(obj).To(Equal(before))
			}
			cc := clientConfig(g, obj, tt.webhook)
			g.Expect(cc.Service).To(BeNil())
			g.Expect(cc.URL).To(Equal(ptr.To(tt.url)))
			rec := records(g, obj)[tt.webhook]
			g.Expect(rec.Bridge).To(Equal(me))
			g.Expect(rec.Written).To(Equal(tt.url))
			g.Expect(string(rec.Original)).To(MatchJSON(mustJSON(t, tt.wantOriginal)))

			// And restoring gives back that original.
			_, err = restoreWebhook(obj, tt.webhook, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(clientConfig(g, obj, tt.webhook).Service).To(Equal(tt.wantOriginal))
			g.Expect(clientConfig(g, obj, tt.webhook).URL).To(BeNil())
		})
	}
}

func TestRestoreAndForgetWebhook(t *testing.T) {
	const url = cmValidateURL
	rewritten := func(t *testing.T, bridge string) *admissionregistrationv1.ValidatingWebhookConfiguration {
		c := certManagerVWC()
		if _, err := rewriteWebhook(c, cmWebhook, url, bridge); err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		name string
		obj  func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration
		// What restore and forget do: changed, and the webhook's client config afterwards.
		wantRestoreChanged bool
		wantRestored       admissionregistrationv1.WebhookClientConfig
		wantForgetChanged  bool
		wantForgot         admissionregistrationv1.WebhookClientConfig
		wantErr            string
	}{
		{
			name:               "rewritten by this bridge",
			obj:                func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration { return rewritten(t, me) },
			wantRestoreChanged: true,
			wantRestored:       admissionregistrationv1.WebhookClientConfig{Service: whRef(cmNS, cmSvc, 443, "/validate"), CABundle: []byte("ca-1")},
			wantForgetChanged:  true,
			wantForgot:         admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url), CABundle: []byte("ca-1")},
		},
		{
			name: "url changed by someone else since: theirs, only the record goes",
			obj: func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := rewritten(t, me)
				c.Webhooks[0].ClientConfig.URL = ptr.To("https://cert-manager.example.com/validate")
				return c
			},
			wantRestoreChanged: true,
			wantRestored:       admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://cert-manager.example.com/validate"), CABundle: []byte("ca-1")},
			wantForgetChanged:  true,
			wantForgot:         admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://cert-manager.example.com/validate"), CABundle: []byte("ca-1")},
		},
		{
			name: "service put back by Helm: left as it is, only the record goes",
			obj: func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
				c := rewritten(t, me)
				c.Webhooks[0].ClientConfig.URL = nil
				c.Webhooks[0].ClientConfig.Service = whRef(cmNS, cmSvc, 443, "/validate-v2")
				return c
			},
			wantRestoreChanged: true,
			wantRestored:       admissionregistrationv1.WebhookClientConfig{Service: whRef(cmNS, cmSvc, 443, "/validate-v2"), CABundle: []byte("ca-1")},
			wantForgetChanged:  true,
			wantForgot:         admissionregistrationv1.WebhookClientConfig{Service: whRef(cmNS, cmSvc, 443, "/validate-v2"), CABundle: []byte("ca-1")},
		},
		{
			name:         "rewritten by another bridge: not ours to restore",
			obj:          func(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration { return rewritten(t, other) },
			wantRestored: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url), CABundle: []byte("ca-1")},
			wantForgot:   admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url), CABundle: []byte("ca-1")},
		},
		{
			name:         "never rewritten",
			obj:          func(*testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration { return certManagerVWC() },
			wantRestored: admissionregistrationv1.WebhookClientConfig{Service: whRef(cmNS, cmSvc, 443, "/validate"), CABundle: []byte("ca-1")},
			wantForgot:   admissionregistrationv1.WebhookClientConfig{Service: whRef(cmNS, cmSvc, 443, "/validate"), CABundle: []byte("ca-1")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := tt.obj(t)
			before := obj.DeepCopy()
			changed, err := restoreWebhook(obj, cmWebhook, me)
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(changed).To(Equal(tt.wantRestoreChanged))
				g.Expect(obj.Webhooks[0].ClientConfig).To(Equal(tt.wantRestored))
				checkRecordGone(g, obj, before, changed)
			}

			obj = before.DeepCopy()
			changed = ForgetWebhook(obj, cmWebhook, me)
			g.Expect(changed).To(Equal(tt.wantForgetChanged))
			g.Expect(obj.Webhooks[0].ClientConfig).To(Equal(tt.wantForgot))
			checkRecordGone(g, obj, before, changed)
		})
	}
}

// checkRecordGone: a change removes this bridge's record of cmWebhook, no change leaves the
// annotations as they were.
func checkRecordGone(g Gomega, obj, before *admissionregistrationv1.ValidatingWebhookConfiguration, changed bool) {
	if !changed {
		g.Expect(obj.Annotations).To(Equal(before.Annotations))
		return
	}
	g.Expect(records(g, obj)).NotTo(HaveKey(cmWebhook))
	g.Expect(obj.Annotations).To(HaveKey("cert-manager.io/inject-ca-from-secret"))
}

func TestRestoreWebhookRemovedFromConfiguration(t *testing.T) {
	g := NewWithT(t)
	c := vwc("kyverno", nil, vwh("a.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/a")), vwh("b.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/b")))
	_, err := rewriteWebhook(&c, "b.kyverno.svc", "https://x.k0smotron.svc/b", me)
	g.Expect(err).NotTo(HaveOccurred())
	c.Webhooks = c.Webhooks[:1] // a new chart version dropped webhook b

	changed, err := restoreWebhook(&c, "b.kyverno.svc", me)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	g.Expect(c.Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
	g.Expect(c.Webhooks).To(HaveLen(1))
	g.Expect(c.Webhooks[0].ClientConfig.Service).To(Equal(whRef("kyverno", "kyverno-svc", 443, "/a")))
}

// The records of the webhooks of one configuration live in one annotation.
func TestWebhookRecordsCoexist(t *testing.T) {
	g := NewWithT(t)
	original := vwc("kyverno", map[string]string{"app": "kyverno"},
		vwh("a.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/a")),
		vwh("b.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/b")),
		vwh("c.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/c")),
	)
	c := original.DeepCopy()

	for _, step := range []struct {
		webhook, bridge string
	}{{"a.kyverno.svc", me}, {"b.kyverno.svc", me}, {"c.kyverno.svc", other}} {
		changed, err := rewriteWebhook(c, step.webhook, "https://"+step.webhook+".k0smotron.svc/", step.bridge)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeTrue())
	}
	rec := records(g, c)
	g.Expect(rec).To(HaveLen(3))
	g.Expect(rec["a.kyverno.svc"].Bridge).To(Equal(me))
	g.Expect(rec["c.kyverno.svc"].Bridge).To(Equal(other))
	g.Expect(string(rec["b.kyverno.svc"].Original)).To(MatchJSON(mustJSON(t, whRef("kyverno", "kyverno-svc", 443, "/b"))))
	// Stable bytes: the same records give the same annotation.
	again := original.DeepCopy()
	for _, w := range []string{"c.kyverno.svc", "b.kyverno.svc", "a.kyverno.svc"} {
		bridge := me
		if w == "c.kyverno.svc" {
			bridge = other
		}
		_, err := rewriteWebhook(again, w, "https://"+w+".k0smotron.svc/", bridge)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(again.Annotations).To(Equal(c.Annotations))

	changed, err := restoreWebhook(c, "a.kyverno.svc", me)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	g.Expect(records(g, c)).To(HaveLen(2))
	g.Expect(records(g, c)).NotTo(HaveKey("a.kyverno.svc"))
	g.Expect(c.Webhooks[1].ClientConfig.URL).To(Equal(ptr.To("https://b.kyverno.svc.k0smotron.svc/")), "b stays rewritten")

	changed, err = restoreWebhook(c, "c.kyverno.svc", me)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeFalse(), "c is the other bridge's")

	_, err = restoreWebhook(c, "b.kyverno.svc", me)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(records(g, c)).To(HaveLen(1))
	_, err = restoreWebhook(c, "c.kyverno.svc", other)
	g.Expect(err).NotTo(HaveOccurred())
	expectSameObject(g, c, &original)
}

func TestRewriteRestoreAPIServiceRoundTrip(t *testing.T) {
	ref := *apiRef(msNS, msSvc+"-guestnet", 443)
	tests := []struct {
		name string
		api  func() *apiregistrationv1.APIService
	}{
		{name: "metrics-server, insecureSkipTLSVerify", api: metricsAPIService},
		{
			name: "caBundle, port left to its default, other annotations",
			api: func() *apiregistrationv1.APIService {
				a := apiService("v1beta1.custom.metrics.k8s.io", apiRef("monitoring", "adapter", 0), apiregistrationv1.ConditionFalse)
				a.Spec.CABundle = []byte("ca-1")
				a.Annotations = map[string]string{"cert-manager.io/inject-ca-from": "monitoring/adapter"}
				return a
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			original := tt.api()
			a := original.DeepCopy()
			ref := ref
			ref.Namespace = original.Spec.Service.Namespace

			changed, err := rewriteAPIService(a, ref, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeTrue())
			g.Expect(a.Spec.Service).To(Equal(&ref))
			g.Expect(a.Spec.InsecureSkipTLSVerify).To(Equal(original.Spec.InsecureSkipTLSVerify))
			g.Expect(a.Spec.CABundle).To(Equal(original.Spec.CABundle))
			rec := records(g, a)[a.Name]
			g.Expect(rec.Bridge).To(Equal(me))
			g.Expect(rec.Written).To(Equal(ref.Namespace + "/metrics-server-guestnet:443"))
			g.Expect(string(rec.Original)).To(MatchJSON(mustJSON(t, original.Spec.Service)))

			// Again: nothing to do.
			rewritten := a.DeepCopy()
			changed, err = rewriteAPIService(a, ref, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeFalse())
			g.Expect(a).To(Equal(rewritten))

			// The user (or cainjector) changes the TLS settings in between: theirs.
			want := original.DeepCopy()
			if a.Spec.InsecureSkipTLSVerify {
				a.Spec.InsecureSkipTLSVerify, a.Spec.CABundle = false, []byte("ca-3")
				want.Spec.InsecureSkipTLSVerify, want.Spec.CABundle = false, []byte("ca-3")
			} else {
				a.Spec.CABundle, want.Spec.CABundle = []byte("ca-2"), []byte("ca-2")
			}

			changed, err = restoreAPIService(a, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeTrue())
			g.Expect(a.Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
			expectSameObject(g, a, want)

			changed, err = restoreAPIService(a, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeFalse())
		})
	}
}

func TestRewriteAPIService(t *testing.T) {
	ref := *apiRef(msNS, msSvc+"-guestnet", 443)
	rewritten := func(t *testing.T, bridge string) *apiregistrationv1.APIService {
		a := metricsAPIService()
		if _, err := rewriteAPIService(a, ref, bridge); err != nil {
			t.Fatal(err)
		}
		return a
	}
	tests := []struct {
		name         string
		api          func(t *testing.T) *apiregistrationv1.APIService
		ref          apiregistrationv1.ServiceReference
		wantErr      string
		wantChanged  bool
		wantOriginal *apiregistrationv1.ServiceReference
	}{
		{
			name: "served by the apiserver itself", api: func(*testing.T) *apiregistrationv1.APIService { return apiService("v1.apps", nil) },
			ref: ref, wantErr: "references no Service",
		},
		{
			name: "same service, port written out: nothing to do",
			api:  func(t *testing.T) *apiregistrationv1.APIService { return rewritten(t, me) },
			ref:  *apiRef(msNS, msSvc+"-guestnet", 443), wantOriginal: apiRef(msNS, msSvc, 443),
		},
		{
			name: "another port: the original stays",
			api:  func(t *testing.T) *apiregistrationv1.APIService { return rewritten(t, me) },
			ref:  *apiRef(msNS, msSvc+"-guestnet", 4443), wantChanged: true, wantOriginal: apiRef(msNS, msSvc, 443),
		},
		{
			name: "Helm revert: the chart's service is the new original",
			api: func(t *testing.T) *apiregistrationv1.APIService {
				a := rewritten(t, me)
				a.Spec.Service = apiRef(msNS, "metrics-server-v2", 0)
				return a
			},
			ref: ref, wantChanged: true, wantOriginal: apiRef(msNS, "metrics-server-v2", 0),
		},
		{
			name: "Helm revert dropping the record too",
			api: func(t *testing.T) *apiregistrationv1.APIService {
				a := rewritten(t, me)
				a.Spec.Service = apiRef(msNS, "metrics-server-v2", 0)
				a.Annotations = nil
				return a
			},
			ref: ref, wantChanged: true, wantOriginal: apiRef(msNS, "metrics-server-v2", 0),
		},
		{
			name: "unreadable record annotation replaced",
			api: func(*testing.T) *apiregistrationv1.APIService {
				a := metricsAPIService()
				a.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: "x"}
				return a
			},
			ref: ref, wantChanged: true, wantOriginal: apiRef(msNS, msSvc, 443),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			a := tt.api(t)
			before := a.DeepCopy()
			changed, err := rewriteAPIService(a, tt.ref, me)
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				g.Expect(a).To(Equal(before))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(Equal(tt.wantChanged))
			if !changed {
				g.Expect(a).To(Equal(before))
			}
			g.Expect(a.Spec.Service.Name).To(Equal(tt.ref.Name))
			g.Expect(ptr.Deref(a.Spec.Service.Port, 443)).To(Equal(ptr.Deref(tt.ref.Port, 443)))
			rec := records(g, a)[a.Name]
			g.Expect(string(rec.Original)).To(MatchJSON(mustJSON(t, tt.wantOriginal)))

			_, err = restoreAPIService(a, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(a.Spec.Service).To(Equal(tt.wantOriginal))
		})
	}
}

func TestRestoreAPIService(t *testing.T) {
	ref := *apiRef(msNS, msSvc+"-guestnet", 443)
	rewritten := func(t *testing.T, bridge string) *apiregistrationv1.APIService {
		a := metricsAPIService()
		if _, err := rewriteAPIService(a, ref, bridge); err != nil {
			t.Fatal(err)
		}
		return a
	}
	tests := []struct {
		name        string
		api         func(t *testing.T) *apiregistrationv1.APIService
		wantChanged bool
		wantService *apiregistrationv1.ServiceReference
		wantRecord  bool
	}{
		{
			name: "rewritten by this bridge", api: func(t *testing.T) *apiregistrationv1.APIService { return rewritten(t, me) },
			wantChanged: true, wantService: apiRef(msNS, msSvc, 443),
		},
		{
			name: "someone pointed it elsewhere since: only the record goes",
			api: func(t *testing.T) *apiregistrationv1.APIService {
				a := rewritten(t, me)
				a.Spec.Service = apiRef(msNS, "metrics-server-v2", 443)
				return a
			},
			wantChanged: true, wantService: apiRef(msNS, "metrics-server-v2", 443),
		},
		{
			name: "made local since: only the record goes",
			api: func(t *testing.T) *apiregistrationv1.APIService {
				a := rewritten(t, me)
				a.Spec.Service = nil
				return a
			},
			wantChanged: true,
		},
		{
			name: "rewritten by another bridge", api: func(t *testing.T) *apiregistrationv1.APIService { return rewritten(t, other) },
			wantService: &ref, wantRecord: true,
		},
		{
			name: "never rewritten", api: func(*testing.T) *apiregistrationv1.APIService { return metricsAPIService() },
			wantService: apiRef(msNS, msSvc, 443),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			a := tt.api(t)
			changed, err := restoreAPIService(a, me)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(Equal(tt.wantChanged))
			g.Expect(a.Spec.Service).To(Equal(tt.wantService))
			g.Expect(hasRecord(a)).To(Equal(tt.wantRecord))
			g.Expect(a.Spec.InsecureSkipTLSVerify).To(BeTrue())
		})
	}
}

func TestIsRewritten(t *testing.T) {
	orig := whRef(cmNS, cmSvc, 443, "/validate")
	tests := []struct {
		name   string
		target Target
		want   bool
	}{
		{name: "no record", target: Target{Kind: guestnetv1.ValidatingWebhookTarget, URL: cmValidateURL}},
		{
			name:   "webhook holds the url guestnet wrote",
			target: Target{Kind: guestnetv1.ValidatingWebhookTarget, URL: cmValidateURL, Record: record(t, me, orig, cmValidateURL)},
			want:   true,
		},
		{
			name:   "webhook url changed since",
			target: Target{Kind: guestnetv1.ValidatingWebhookTarget, URL: "https://elsewhere/", Record: record(t, me, orig, cmValidateURL)},
		},
		{
			name: "webhook service put back",
			target: Target{Kind: guestnetv1.MutatingWebhookTarget, Service: &ServiceRef{Namespace: cmNS, Name: cmSvc, Port: 443},
				Record: record(t, me, orig, cmValidateURL)},
		},
		{
			name: "APIService holds the service guestnet wrote (port defaulted)",
			target: Target{Kind: guestnetv1.APIServiceTarget, Service: &ServiceRef{Namespace: msNS, Name: "metrics-server-guestnet", Port: 443},
				Record: record(t, me, apiRef(msNS, msSvc, 0), "kube-system/metrics-server-guestnet:443")},
			want: true,
		},
		{
			name: "APIService service changed since",
			target: Target{Kind: guestnetv1.APIServiceTarget, Service: &ServiceRef{Namespace: msNS, Name: msSvc, Port: 443},
				Record: record(t, me, apiRef(msNS, msSvc, 0), "kube-system/metrics-server-guestnet:443")},
		},
		{
			name:   "APIService made local",
			target: Target{Kind: guestnetv1.APIServiceTarget, Record: record(t, me, apiRef(msNS, msSvc, 0), "kube-system/metrics-server-guestnet:443")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(IsRewritten(tt.target)).To(Equal(tt.want))
		})
	}
}
