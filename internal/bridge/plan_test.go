package bridge

import (
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// webhookTarget is the target of cert-manager's validating webhook after mutate.
func webhookTarget(t *testing.T, mutate ...func(*admissionregistrationv1.ValidatingWebhookConfiguration)) Target {
	t.Helper()
	c := certManagerVWC()
	for _, m := range mutate {
		m(c)
	}
	return WebhookTargets(c)[0]
}

func apiServiceTarget(t *testing.T, a *apiregistrationv1.APIService, mutate ...func(*apiregistrationv1.APIService)) Target {
	t.Helper()
	for _, m := range mutate {
		m(a)
	}
	return APIServiceTarget(a)
}

// rewrittenBy rewrites cert-manager's validating webhook to url, for bridge.
func rewrittenBy(t *testing.T, bridge, url string) func(*admissionregistrationv1.ValidatingWebhookConfiguration) {
	return func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		t.Helper()
		if _, err := RewriteWebhook(c, cmWebhook, url, NewRecord(WebhookTargets(c)[0], bridge, url)); err != nil {
			t.Fatal(err)
		}
	}
}

func apiRewrittenBy(t *testing.T, bridge string, ref *apiregistrationv1.ServiceReference) func(*apiregistrationv1.APIService) {
	return func(a *apiregistrationv1.APIService) {
		t.Helper()
		written := ServiceRef{Namespace: ref.Namespace, Name: ref.Name, Port: ptr.Deref(ref.Port, 443)}.String()
		if _, err := RewriteAPIService(a, *ref, NewRecord(APIServiceTarget(a), bridge, written)); err != nil {
			t.Fatal(err)
		}
	}
}

// bridgeNodePortService is the bridge's NodePort Service for a guest Service as the guest holds it.
func bridgeNodePortService(t *testing.T, gwb *guestnetv1.GuestWebhookBridge, svc corev1.Service, nodePorts map[int32]int32) corev1.Service {
	t.Helper()
	b := &Backend{Service: &svc, NodePortService: hostnames.BridgeNodePortService(svc.Name)}
	for _, p := range svc.Spec.Ports {
		b.Ports = append(b.Ports, BackendPort{Name: p.Name, Port: p.Port, TargetPort: p.TargetPort, NodePort: nodePorts[p.Port]})
	}
	return toService(t, GuestNodePortService(gwb, b))
}

// checkPlanInvariants holds for every plan.
func checkPlanInvariants(g Gomega, gwb *guestnetv1.GuestWebhookBridge, p *Plan) {
	r := gwb.Spec.NodePortRange
	seen := map[int32]string{}
	for _, b := range p.Backends {
		for _, port := range b.Ports {
			if port.NodePort == 0 {
				continue
			}
			g.Expect(port.NodePort).To(BeNumerically(">=", r.Start), "%s port %d", b.Key(), port.Port)
			g.Expect(port.NodePort).To(BeNumerically("<", r.Start+r.Size), "%s port %d", b.Key(), port.Port)
			g.Expect(seen).NotTo(HaveKey(port.NodePort), "nodePort %d given twice", port.NodePort)
			seen[port.NodePort] = b.Key()
		}
	}
	for _, tp := range p.Targets {
		if tp.Action == RewriteAction {
			g.Expect(tp.Reason).To(BeEmpty(), "%s: a rewrite with a problem", tp.Target)
			g.Expect(tp.ViaBridge()).To(BeTrue(), "%s: a rewrite without a backend", tp.Target)
			g.Expect(tp.Bridged).To(BeTrue(), "%s", tp.Target)
		}
		if tp.Reason != "" {
			g.Expect(tp.Bridged).To(BeFalse(), "%s: bridged with reason %s", tp.Target, tp.Reason)
		}
		if tp.ViaBridge() && tp.Reason == "" {
			g.Expect(tp.Backend.NodePort(tp.Port)).NotTo(BeZero(), "%s", tp.Target)
			g.Expect(tp.TLSServerName).NotTo(BeEmpty())
			if tp.IsWebhook() {
				g.Expect(tp.URL).To(HavePrefix("https://"))
			} else {
				g.Expect(tp.APIServiceRef).NotTo(BeNil())
			}
		}
	}
}

func TestMakePlanDecisions(t *testing.T) {
	metricsRef := apiRef(msNS, "metrics-server-guestnet", 443)
	tests := []struct {
		name     string
		gwb      *guestnetv1.GuestWebhookBridge
		target   Target
		services []corev1.Service // the default guest Services when nil
		reach    Reachability
		// host is the host copy of the records, hostServices the bridge's host Services.
		host         HostRecords
		hostServices map[string]bool

		wantAction    Action
		wantReason    string
		wantBridged   bool
		wantViaBridge bool
		wantMessage   string
		wantWarnings  []string
	}{
		{
			name:        "named but not in the guest",
			target:      Target{Kind: guestnetv1.ValidatingWebhookTarget, Name: "cert-manager-webhook"},
			wantReason:  guestnetv1.TargetNotFoundReason,
			wantMessage: "ValidatingWebhookConfiguration cert-manager-webhook does not exist in the guest",
		},
		{
			name:        "rewritten by another bridge",
			target:      webhookTarget(t, rewrittenBy(t, other, "https://x.k0smotron.svc/validate")),
			wantReason:  guestnetv1.TargetClaimedReason,
			wantMessage: "bridged by GuestWebhookBridge other-bridge of this namespace; remove it from one of the two bridges",
		},
		{
			name:         "APIService rewritten by another bridge",
			target:       apiServiceTarget(t, metricsAPIService(), apiRewrittenBy(t, other, metricsRef)),
			wantReason:   guestnetv1.TargetClaimedReason,
			wantMessage:  "bridged by GuestWebhookBridge other-bridge of this namespace",
			wantWarnings: []string{"insecureSkipTLSVerify is true"},
		},
		{
			name: "a url of its own: left alone, not bridged",
			target: webhookTarget(t, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].ClientConfig.Service = nil
				c.Webhooks[0].ClientConfig.URL = ptr.To("https://cert-manager-webhook.example.com/validate")
			}),
			wantMessage: "has clientConfig.url https://cert-manager-webhook.example.com/validate already",
		},
		{
			name: "own record, url changed by someone else since: forget it",
			target: webhookTarget(t, rewrittenBy(t, me, cmValidateURL), func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].ClientConfig.URL = ptr.To("https://cert-manager-webhook.example.com/validate")
			}),
			wantAction:  ForgetAction,
			wantMessage: "changed to https://cert-manager-webhook.example.com/validate after guestnet bridged it",
		},
		{
			name:        "APIService served by the guest apiserver",
			target:      apiServiceTarget(t, apiService("v1.apps", nil, apiregistrationv1.ConditionTrue)),
			wantMessage: "nothing to bridge",
		},
		{
			name:        "Auto: APIService not checked by the aggregator yet",
			target:      apiServiceTarget(t, apiService(metricsAPI, apiRef(msNS, msSvc, 443))),
			wantReason:  guestnetv1.WaitingForAvailabilityReason,
			wantMessage: "waiting for the aggregator's first availability check",
		},
		{
			name:        "Auto: APIService available through its Service",
			target:      apiServiceTarget(t, apiService(metricsAPI, apiRef(msNS, msSvc, 443), apiregistrationv1.ConditionTrue)),
			wantBridged: true,
			wantMessage: "left alone (mode Auto): Available=True",
		},
		{
			name:          "Auto: APIService unavailable",
			target:        apiServiceTarget(t, metricsAPIService()),
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
			wantWarnings:  []string{"insecureSkipTLSVerify is true: the guest apiserver does not verify"},
		},
		{
			// The real konnectivity: the aggregator dials the bridge's name through the agents too.
			name:         "Auto: APIService unavailable in a guest that runs konnectivity agents",
			target:       apiServiceTarget(t, metricsAPIService()),
			reach:        Reachability{Evidence: "no ready konnectivity agent", Agents: 2},
			wantReason:   guestnetv1.APIServiceViaKonnectivityReason,
			wantMessage:  "not bridged (mode Auto): Available=False through its Service, and the guest runs 2 konnectivity agent pods",
			wantWarnings: []string{"insecureSkipTLSVerify is true"},
		},
		{
			name:          "Always: APIService unavailable in a guest that runs konnectivity agents: bridged as asked",
			gwb:           newBridge(always),
			target:        apiServiceTarget(t, metricsAPIService()),
			reach:         Reachability{Agents: 2},
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
			wantWarnings:  []string{"insecureSkipTLSVerify is true"},
		},
		{
			name:        "Auto: webhook, the guest apiserver reaches guest Services",
			target:      webhookTarget(t),
			reach:       Reachability{Reaches: true, Evidence: "3 konnectivity agents are ready"},
			wantBridged: true,
			wantMessage: "left alone (mode Auto): 3 konnectivity agents are ready",
		},
		{
			name:          "Auto: webhook, no evidence the guest apiserver reaches guest Services",
			target:        webhookTarget(t),
			reach:         Reachability{Evidence: "no ready konnectivity agent"},
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:          "Always: APIService not checked yet",
			gwb:           newBridge(always),
			target:        apiServiceTarget(t, apiService(metricsAPI, apiRef(msNS, msSvc, 443))),
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:          "Always: APIService available anyway",
			gwb:           newBridge(always),
			target:        apiServiceTarget(t, apiService(metricsAPI, apiRef(msNS, msSvc, 443), apiregistrationv1.ConditionTrue)),
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:          "Always: webhook the guest apiserver reaches anyway",
			gwb:           newBridge(always),
			target:        webhookTarget(t),
			reach:         Reachability{Reaches: true, Evidence: "agents"},
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:        "guest Service missing",
			target:      webhookTarget(t),
			services:    []corev1.Service{chartService(msNS, msSvc, 443)},
			wantReason:  guestnetv1.GuestServiceNotFoundReason,
			wantMessage: "its Service cert-manager/cert-manager-webhook does not exist in the guest",
		},
		{
			name:   "guest Service without a selector",
			target: webhookTarget(t),
			services: func() []corev1.Service {
				svc := chartService(cmNS, cmSvc, 443)
				svc.Spec.Selector = nil
				return []corev1.Service{svc}
			}(),
			wantReason:  guestnetv1.TargetNotBridgeableReason,
			wantMessage: "has no selector",
		},
		{
			name:        "guest Service without the port",
			target:      webhookTarget(t),
			services:    []corev1.Service{chartService(cmNS, cmSvc, 10250, 8443)},
			wantReason:  guestnetv1.TargetNotBridgeableReason,
			wantMessage: "has no TCP port 443 (it has 10250/TCP, 8443/TCP)",
		},
		{
			name:   "guest Service port is UDP",
			target: webhookTarget(t),
			services: func() []corev1.Service {
				svc := chartService(cmNS, cmSvc, 443)
				svc.Spec.Ports[0].Protocol = corev1.ProtocolUDP
				return []corev1.Service{svc}
			}(),
			wantReason:  guestnetv1.TargetNotBridgeableReason,
			wantMessage: "has no TCP port 443 (it has 443/UDP)",
		},
		{
			name: "the field report's workaround: failurePolicy Ignore, timeoutSeconds 5: warned, still bridged",
			target: webhookTarget(t, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
				c.Webhooks[0].TimeoutSeconds = ptr.To[int32](5)
			}),
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
			wantWarnings:  []string{"failurePolicy is Ignore", "timeoutSeconds is 5, shortened below the default 10"},
		},
		{
			name: "defaults (no failurePolicy, no timeoutSeconds): no warning",
			target: webhookTarget(t, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].FailurePolicy, c.Webhooks[0].TimeoutSeconds = nil, nil
			}),
			wantAction: RewriteAction, wantBridged: true, wantViaBridge: true,
		},
		{
			name:          "rewritten by this bridge, as planned: nothing to do",
			target:        webhookTarget(t, rewrittenBy(t, me, cmValidateURL)),
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:          "APIService rewritten by this bridge, as planned: nothing to do",
			target:        apiServiceTarget(t, metricsAPIService(), apiRewrittenBy(t, me, metricsRef)),
			wantBridged:   true,
			wantViaBridge: true,
			wantWarnings:  []string{"insecureSkipTLSVerify"},
		},
		{
			name:          "APIService rewritten by this bridge, Available=True through the bridge: stays",
			target:        apiServiceTarget(t, apiService(metricsAPI, apiRef(msNS, msSvc, 443), apiregistrationv1.ConditionTrue), apiRewrittenBy(t, me, metricsRef)),
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:          "rewritten by this bridge to an older url: rewritten again",
			target:        webhookTarget(t, rewrittenBy(t, me, "https://old-name.k0smotron.svc/validate")),
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name: "Helm put the service back (record still there): repaired, even in Auto with reach",
			target: webhookTarget(t, rewrittenBy(t, me, cmValidateURL), func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks[0].ClientConfig.URL = nil
				c.Webhooks[0].ClientConfig.Service = whRef(cmNS, cmSvc, 443, "/validate")
			}),
			reach:         Reachability{Reaches: true, Evidence: "agents"},
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name: "APIService put back by Helm: repaired",
			target: apiServiceTarget(t, apiService(metricsAPI, apiRef(msNS, msSvc, 443)), apiRewrittenBy(t, me, metricsRef), func(a *apiregistrationv1.APIService) {
				a.Spec.Service = apiRef(msNS, msSvc, 443)
			}),
			wantAction: RewriteAction, wantBridged: true, wantViaBridge: true,
		},
		{
			name:        "rewritten, then its guest Service went away: stays rewritten, reported",
			target:      webhookTarget(t, rewrittenBy(t, me, cmValidateURL)),
			services:    []corev1.Service{},
			wantReason:  guestnetv1.GuestServiceNotFoundReason,
			wantMessage: "cert-manager/cert-manager-webhook does not exist",
		},
		{
			name: "rewritten, record unreadable",
			target: func() Target {
				tg := webhookTarget(t, rewrittenBy(t, me, cmValidateURL))
				tg.Record.Original = []byte(`"not a service"`)
				return tg
			}(),
			wantReason:  guestnetv1.RecordUnreadableReason,
			wantMessage: "its record's original is not a service reference",
		},
		{
			name:        "a Service of someone else's has the bridge's NodePort Service name",
			target:      webhookTarget(t),
			services:    append(defaultGuestServices(), chartService(cmNS, "cert-manager-webhook-guestnet-nodeport", 443)),
			wantReason:  guestnetv1.HostObjectConflictReason,
			wantMessage: "the guest already has a Service cert-manager/cert-manager-webhook-guestnet-nodeport that is not this bridge's",
		},
		{
			name:          "the bridge's own NodePort Service is no conflict",
			target:        webhookTarget(t),
			services:      append(defaultGuestServices(), bridgeNodePortService(t, newBridge(), chartService(cmNS, cmSvc, 443), map[int32]int32{443: 32705})),
			wantAction:    RewriteAction,
			wantBridged:   true,
			wantViaBridge: true,
		},
		{
			name:         "a Service of someone else's has the bridge's ExternalName Service name",
			target:       apiServiceTarget(t, metricsAPIService()),
			services:     append(defaultGuestServices(), chartService(msNS, "metrics-server-guestnet", 443)),
			wantReason:   guestnetv1.HostObjectConflictReason,
			wantMessage:  "kube-system/metrics-server-guestnet that is not this bridge's",
			wantWarnings: []string{"insecureSkipTLSVerify"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			gwb := tt.gwb
			if gwb == nil {
				gwb = newBridge()
			}
			services := tt.services
			if services == nil {
				services = defaultGuestServices()
			}
			p := MakePlan(Input{Bridge: gwb, Targets: []Target{tt.target}, GuestServices: services, Reach: tt.reach,
				Host: tt.host, HostServices: tt.hostServices, Claimants: map[string]bool{other: true}})
			checkPlanInvariants(g, gwb, p)
			g.Expect(p.Targets).To(HaveLen(1))
			tp := p.Targets[0]
			g.Expect(tp.Key()).To(Equal(tt.target.Key()))
			g.Expect(tp.Action).To(Equal(tt.wantAction), "action")
			g.Expect(tp.Reason).To(Equal(tt.wantReason), "reason (message %q)", tp.Message)
			g.Expect(tp.Bridged).To(Equal(tt.wantBridged), "bridged")
			g.Expect(tp.ViaBridge()).To(Equal(tt.wantViaBridge), "via bridge")
			g.Expect(tp.Message).To(ContainSubstring(tt.wantMessage))
			g.Expect(tp.Warnings).To(HaveLen(len(tt.wantWarnings)), "warnings %v", tp.Warnings)
			for i, w := range tt.wantWarnings {
				g.Expect(tp.Warnings[i]).To(ContainSubstring(w))
			}
			for _, b := range p.Backends {
				// The bridge keeps Services only for targets that go through it.
				g.Expect(p.Used(b)).To(Equal(tt.wantViaBridge), "backend %s used", b.Key())
			}
			if tt.wantViaBridge {
				g.Expect(p.Backends).To(HaveLen(1))
			}
		})
	}
}

func TestMakePlanBackends(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge(always)
	kyverno := chartService("kyverno", "kyverno-svc", 443, 9443)
	kyverno.Spec.Ports[0].TargetPort = intstr.FromInt32(9443)
	kyverno.Spec.Ports[1].TargetPort = intstr.IntOrString{} // unset: the port itself
	kyvernoVWC := vwc("kyverno", nil,
		vwh("a.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "/a")),
		vwh("b.kyverno.svc", whRef("kyverno", "kyverno-svc", 9443, "/b")),
		vwh("c.kyverno.svc", whRef("kyverno", "kyverno-svc", 443, "")),
	)
	// An APIService and a webhook served by one Service.
	both := apiService("v1alpha1.both.example.io", apiRef("both", "both-api", 8443))
	bothVWC := vwc("both", nil, vwh("both.example.io", whRef("both", "both-api", 8443, "/validate")))
	obs := Observed{
		APIServices:        []apiregistrationv1.APIService{*metricsAPIService(), *both},
		ValidatingWebhooks: []admissionregistrationv1.ValidatingWebhookConfiguration{*certManagerVWC(), kyvernoVWC, bothVWC},
		MutatingWebhooks:   []admissionregistrationv1.MutatingWebhookConfiguration{*certManagerMWC()},
	}
	all := &guestnetv1.TargetSelector{All: true}
	gwb.Spec.APIServices, gwb.Spec.ValidatingWebhooks, gwb.Spec.MutatingWebhooks = all, all, all
	targets, err := Select(&gwb.Spec, obs, HostRecords{})
	g.Expect(err).NotTo(HaveOccurred())
	services := append(defaultGuestServices(), kyverno, chartService("both", "both-api", 8443))

	p := MakePlan(Input{Bridge: gwb, Targets: targets, GuestServices: services})
	checkPlanInvariants(g, gwb, p)

	// One backend per guest Service, sorted, nodePorts in that order from the range's start.
	var keys []string
	for _, b := range p.Backends {
		keys = append(keys, b.Key())
	}
	g.Expect(keys).To(Equal([]string{"both/both-api", "cert-manager/cert-manager-webhook", "kube-system/metrics-server", "kyverno/kyverno-svc"}))

	byKey := map[string]*TargetPlan{}
	for i := range p.Targets {
		tp := &p.Targets[i]
		g.Expect(tp.Action).To(Equal(RewriteAction), tp.Key())
		g.Expect(tp.Bridged).To(BeTrue(), tp.Key())
		byKey[tp.Key()] = tp
	}

	both0, cm, ms, ky := p.Backends[0], p.Backends[1], p.Backends[2], p.Backends[3]
	g.Expect(both0.APIService).To(BeTrue())
	g.Expect(both0.Ports).To(Equal([]BackendPort{{Name: "https", Port: 8443, TargetPort: intstr.FromString("https"), NodePort: 32700}}))
	g.Expect(both0.guestServiceNames()).To(Equal([]string{"both-api-guestnet-nodeport", "both-api-guestnet"}))

	g.Expect(cm.APIService).To(BeFalse(), "webhooks only: no ExternalName Service")
	g.Expect(cm.guestServiceNames()).To(Equal([]string{"cert-manager-webhook-guestnet-nodeport"}))
	g.Expect(cm.NodePortService).To(Equal("cert-manager-webhook-guestnet-nodeport"))
	g.Expect(cm.HostService).To(Equal(cmHostService))
	g.Expect(cm.Ports).To(Equal([]BackendPort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https"), NodePort: 32701}}))
	g.Expect(cm.Service.Name).To(Equal(cmSvc))

	g.Expect(ms.APIService).To(BeTrue())
	g.Expect(ms.ExternalNameService).To(Equal("metrics-server-guestnet"))
	g.Expect(ms.HostService).To(Equal(msHostService))
	g.Expect(ms.Ports).To(HaveLen(1))
	g.Expect(ms.Ports[0].NodePort).To(Equal(int32(32702)))

	g.Expect(ky.Ports).To(Equal([]BackendPort{
		{Port: 443, TargetPort: intstr.FromInt32(9443), NodePort: 32703},
		{Port: 9443, TargetPort: intstr.FromInt32(9443), NodePort: 32704},
	}))
	g.Expect(ky.Ports[0].PortName()).To(Equal("port-443"))

	// Two webhooks on one Service share its backend and its nodePort.
	validate := byKey["ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io"]
	mutate := byKey["MutatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io"]
	g.Expect(validate.Backend).To(BeIdenticalTo(cm))
	g.Expect(mutate.Backend).To(BeIdenticalTo(cm))
	g.Expect(validate.URL).To(Equal("https://tenant-a-cert-manager-cert-manager-webhook.k0smotron.svc/validate"))
	g.Expect(mutate.URL).To(Equal("https://tenant-a-cert-manager-cert-manager-webhook.k0smotron.svc/mutate"))
	g.Expect(validate.TLSServerName).To(Equal("tenant-a-cert-manager-cert-manager-webhook.k0smotron.svc"))
	g.Expect(mutate.TLSServerName).To(Equal(validate.TLSServerName))
	g.Expect(validate.APIServiceRef).To(BeNil())
	g.Expect(validate.Service).To(Equal(&ServiceRef{Namespace: cmNS, Name: cmSvc, Port: 443, Path: "/validate"}))

	// The APIService points at the ExternalName Service next to its own, at its port.
	metrics := byKey["APIService/v1beta1.metrics.k8s.io"]
	g.Expect(metrics.Backend).To(BeIdenticalTo(ms))
	g.Expect(metrics.APIServiceRef).To(Equal(apiRef(msNS, "metrics-server-guestnet", 443)))
	g.Expect(metrics.TLSServerName).To(Equal("metrics-server-guestnet.kube-system.svc"))
	g.Expect(metrics.URL).To(BeEmpty())

	// Ports other than 443 are in the url; an empty path stays empty.
	g.Expect(byKey["ValidatingWebhookConfiguration/kyverno/a.kyverno.svc"].URL).To(Equal("https://tenant-a-kyverno-kyverno-svc.k0smotron.svc/a"))
	g.Expect(byKey["ValidatingWebhookConfiguration/kyverno/b.kyverno.svc"].URL).To(Equal("https://tenant-a-kyverno-kyverno-svc.k0smotron.svc:9443/b"))
	g.Expect(byKey["ValidatingWebhookConfiguration/kyverno/c.kyverno.svc"].URL).To(Equal("https://tenant-a-kyverno-kyverno-svc.k0smotron.svc"))
	g.Expect(byKey["ValidatingWebhookConfiguration/kyverno/b.kyverno.svc"].Backend.NodePort(9443)).To(Equal(int32(32704)))

	// An APIService and a webhook on one Service.
	g.Expect(byKey["APIService/v1alpha1.both.example.io"].APIServiceRef).To(Equal(apiRef("both", "both-api-guestnet", 8443)))
	g.Expect(byKey["APIService/v1alpha1.both.example.io"].TLSServerName).To(Equal("both-api-guestnet.both.svc"))
	g.Expect(byKey["ValidatingWebhookConfiguration/both/both.example.io"].URL).To(Equal("https://tenant-a-both-both-api.k0smotron.svc:8443/validate"))
	g.Expect(byKey["ValidatingWebhookConfiguration/both/both.example.io"].Backend).To(BeIdenticalTo(both0))

	for _, b := range p.Backends {
		g.Expect(p.Used(b)).To(BeTrue())
		g.Expect(ServiceKey(b, b.NodePortService).Namespace).To(Equal(b.Service.Namespace))
	}
}

// nodePortGuest makes one webhook target per guest Service name, each on port 443.
func nodePortTargets(names ...string) ([]Target, []corev1.Service) {
	var targets []Target
	var services []corev1.Service
	for _, n := range names {
		targets = append(targets, Target{
			Kind: guestnetv1.ValidatingWebhookTarget, Name: n, Webhook: n + ".example.io", Found: true,
			Service: &ServiceRef{Namespace: "apps", Name: n, Port: 443, Path: "/"},
		})
		services = append(services, chartService("apps", n, 443))
	}
	return targets, services
}

func TestAllocateNodePorts(t *testing.T) {
	small := func(size int32) func(*guestnetv1.GuestWebhookBridge) {
		return func(gwb *guestnetv1.GuestWebhookBridge) {
			gwb.Spec.NodePortRange = guestnetv1.NodePortRange{Start: 32700, Size: size}
		}
	}
	own := func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge, name string, nodePort int32) corev1.Service {
		return bridgeNodePortService(t, gwb, chartService("apps", name, 443), map[int32]int32{443: nodePort})
	}
	tests := []struct {
		name     string
		gwb      *guestnetv1.GuestWebhookBridge
		targets  []string // webhook targets on guest Services apps/<name>:443
		services func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service
		// want is the nodePort of each target (0: none), in the order of targets.
		want        []int32
		wantReasons []string
		wantMessage string // of the first exhausted target
	}{
		{
			name: "lowest free ports, in the order of the backends", gwb: newBridge(small(4)),
			targets: []string{"c", "a", "b"}, want: []int32{32702, 32700, 32701},
		},
		{
			name: "the bridge's existing nodePort is kept, even with a lower one free", gwb: newBridge(small(4)),
			targets: []string{"a", "b"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "b", 32700), own(t, gwb, "a", 32703)}
			},
			want: []int32{32703, 32700},
		},
		{
			name: "a kept nodePort is not given to a new target", gwb: newBridge(small(4)),
			targets: []string{"a", "b", "c"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "c", 32700)}
			},
			want: []int32{32701, 32702, 32700},
		},
		{
			name: "nodePorts other guest Services hold are skipped", gwb: newBridge(small(4)),
			targets: []string{"a", "b"},
			services: func(*testing.T, *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{nodePortService("projectcontour", "envoy", 32700, 32702, 30080)}
			},
			want: []int32{32701, 32703},
		},
		{
			name: "a NodePort Service of a dropped target holds its port until it is deleted", gwb: newBridge(small(4)),
			targets: []string{"a"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "dropped", 32700)}
			},
			want: []int32{32701},
		},
		{
			name: "another bridge's NodePort Service holds its ports", gwb: newBridge(small(4)),
			targets: []string{"a"},
			services: func(t *testing.T, _ *guestnetv1.GuestWebhookBridge) []corev1.Service {
				otherBridge := newBridge(func(b *guestnetv1.GuestWebhookBridge) { b.Name = "other-bridge" })
				return []corev1.Service{own(t, otherBridge, "x", 32700)}
			},
			want: []int32{32701},
		},
		{
			name: "our existing nodePort taken by someone else meanwhile: another one", gwb: newBridge(small(4)),
			targets: []string{"a"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "a", 32700), nodePortService("projectcontour", "envoy", 32700)}
			},
			want: []int32{32701},
		},
		{
			name: "a nodePort outside a changed range is re-allocated", gwb: newBridge(small(4)),
			targets: []string{"a", "b"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "a", 32690), own(t, gwb, "b", 32704)}
			},
			want: []int32{32700, 32701},
		},
		{
			name: "exhausted: held by other guest Services", gwb: newBridge(small(2)),
			targets: []string{"a"},
			services: func(*testing.T, *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{nodePortService("projectcontour", "envoy", 32700), nodePortService("monitoring", "grafana", 32701)}
			},
			want:        []int32{0},
			wantReasons: []string{guestnetv1.NodePortRangeExhaustedReason},
			wantMessage: "no free nodePort in spec.nodePortRange 32700-32701 for apps/a:443; other guest Services hold 32700 (projectcontour/envoy), 32701 (monitoring/grafana): widen the range",
		},
		{
			name: "exhausted by the bridge's own targets: the first ones keep theirs", gwb: newBridge(small(2)),
			targets:     []string{"a", "b", "c"},
			want:        []int32{32700, 32701, 0},
			wantReasons: []string{"", "", guestnetv1.NodePortRangeExhaustedReason},
			wantMessage: "no free nodePort in spec.nodePortRange 32700-32701 for apps/c:443: widen the range or move it",
		},
		{
			name: "exhausted: the target holding a nodePort keeps it, the new one waits", gwb: newBridge(small(2)),
			targets: []string{"a", "b", "c"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "c", 32701), nodePortService("projectcontour", "envoy", 32700)}
			},
			want:        []int32{0, 0, 32701},
			wantReasons: []string{guestnetv1.NodePortRangeExhaustedReason, guestnetv1.NodePortRangeExhaustedReason, ""},
			wantMessage: "other guest Services hold 32700 (projectcontour/envoy)",
		},
		{
			name: "two Services of the bridge claim one nodePort: the first keeps it", gwb: newBridge(small(4)),
			targets: []string{"a", "b"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				return []corev1.Service{own(t, gwb, "a", 32702), own(t, gwb, "b", 32702)}
			},
			want: []int32{32702, 32700},
		},
		{
			name: "a guest Service of the bridge that is not NodePort holds nothing", gwb: newBridge(small(2)),
			targets: []string{"a"},
			services: func(t *testing.T, gwb *guestnetv1.GuestWebhookBridge) []corev1.Service {
				svc := own(t, gwb, "a", 32701)
				svc.Spec.Type = corev1.ServiceTypeLoadBalancer
				return []corev1.Service{svc}
			},
			// Not the bridge's NodePort Service: someone else's port.
			want: []int32{32700},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			targets, services := nodePortTargets(tt.targets...)
			if tt.services != nil {
				services = append(services, tt.services(t, tt.gwb)...)
			}
			p := MakePlan(Input{Bridge: tt.gwb, Targets: targets, GuestServices: services})
			checkPlanInvariants(g, tt.gwb, p)

			byName := map[string]*TargetPlan{}
			for i := range p.Targets {
				byName[p.Targets[i].Name] = &p.Targets[i]
			}
			for i, name := range tt.targets {
				tp := byName[name]
				wantReason := ""
				if tt.wantReasons != nil {
					wantReason = tt.wantReasons[i]
				}
				g.Expect(tp.Reason).To(Equal(wantReason), "target %s: %s", name, tp.Message)
				if tt.want[i] == 0 {
					g.Expect(tp.ViaBridge()).To(BeFalse(), "target %s", name)
					g.Expect(tp.Action).To(Equal(NoAction), "target %s", name)
					g.Expect(tp.Bridged).To(BeFalse())
					g.Expect(tp.Message).To(ContainSubstring(tt.wantMessage))
					continue
				}
				g.Expect(tp.ViaBridge()).To(BeTrue(), "target %s", name)
				g.Expect(tp.Backend.NodePort(443)).To(Equal(tt.want[i]), "target %s", name)
				g.Expect(tp.Action).To(Equal(RewriteAction))
			}
		})
	}
}

// A target guestnet rewrote stays rewritten when the range runs out: taking it back would
// not make it work, and its record is what restores it later.
func TestRewrittenTargetsStayWhenExhausted(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge(func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.NodePortRange = guestnetv1.NodePortRange{Start: 32700, Size: 1}
	})
	target := webhookTarget(t, rewrittenBy(t, me, cmValidateURL))
	services := append(defaultGuestServices(), nodePortService("projectcontour", "envoy", 32700))

	p := MakePlan(Input{Bridge: gwb, Targets: []Target{target}, GuestServices: services})
	checkPlanInvariants(g, gwb, p)
	tp := p.Targets[0]
	g.Expect(tp.Reason).To(Equal(guestnetv1.NodePortRangeExhaustedReason))
	g.Expect(tp.Action).To(Equal(NoAction), "neither rewritten again nor taken back")
	g.Expect(tp.Bridged).To(BeFalse())
	g.Expect(tp.Message).To(ContainSubstring("32700 (projectcontour/envoy)"))
	g.Expect(tp.URL).To(Equal(cmValidateURL))
	g.Expect(tp.Service).To(Equal(&ServiceRef{Namespace: cmNS, Name: cmSvc, Port: 443, Path: "/validate"}), "the recorded original")
	for _, b := range p.Backends {
		g.Expect(p.Used(b)).To(BeFalse(), "no nodePort, no Services")
	}

	// The same for a rewritten APIService.
	api := apiServiceTarget(t, metricsAPIService(), apiRewrittenBy(t, me, apiRef(msNS, "metrics-server-guestnet", 443)))
	p = MakePlan(Input{Bridge: gwb, Targets: []Target{api}, GuestServices: services})
	checkPlanInvariants(g, gwb, p)
	g.Expect(p.Targets[0].Reason).To(Equal(guestnetv1.NodePortRangeExhaustedReason))
	g.Expect(p.Targets[0].Action).To(Equal(NoAction))
}

// Block stops the targets of one backend; rewritten ones stay rewritten.
func TestBlock(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge(always)
	fresh := webhookTarget(t)
	fresh.Kind = guestnetv1.MutatingWebhookTarget // another object on the same Service
	rewritten := webhookTarget(t, rewrittenBy(t, me, cmValidateURL))
	metrics := apiServiceTarget(t, metricsAPIService())
	missing := Target{Kind: guestnetv1.ValidatingWebhookTarget, Name: "gone"}
	p := MakePlan(Input{Bridge: gwb, Targets: []Target{fresh, rewritten, metrics, missing}, GuestServices: defaultGuestServices()})
	g.Expect(p.Backends).To(HaveLen(2))
	cm, ms := p.Backends[0], p.Backends[1]
	g.Expect(cm.Key()).To(Equal("cert-manager/cert-manager-webhook"))

	p.Block(cm, guestnetv1.NodePortConflictReason, "the guest refused the nodePort")
	checkPlanInvariants(g, gwb, p)
	for _, tp := range p.Targets {
		switch {
		case tp.Name == "gone":
			g.Expect(tp.Reason).To(Equal(guestnetv1.TargetNotFoundReason), "a target with a reason keeps it")
		case tp.Backend == cm:
			g.Expect(tp.Reason).To(Equal(guestnetv1.NodePortConflictReason), tp.Key())
			g.Expect(tp.Message).To(Equal("the guest refused the nodePort"))
			g.Expect(tp.Bridged).To(BeFalse())
			g.Expect(tp.Action).To(Equal(NoAction), tp.Key())
		default:
			g.Expect(tp.Backend).To(BeIdenticalTo(ms))
			g.Expect(tp.Reason).To(BeEmpty())
			g.Expect(tp.Action).To(Equal(RewriteAction))
			g.Expect(tp.Bridged).To(BeTrue())
		}
	}
	g.Expect(p.Used(ms)).To(BeTrue())
	g.Expect(p.Used(cm)).To(BeTrue(), "its Services stay: a rewritten target calls them")
	g.Expect(p.Used(&Backend{})).To(BeFalse(), "a backend no target goes through")

	// A backend without any nodePort is not used.
	for i := range ms.Ports {
		ms.Ports[i].NodePort = 0
	}
	g.Expect(ms.Usable()).To(BeFalse())
	g.Expect(p.Used(ms)).To(BeFalse())
}

// Two guest Services whose "<cluster>-<namespace>-<service>" host names coincide get two
// host Services: the second one's name carries a hash.
func TestMakePlanDisambiguatesHostServiceNames(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge()
	first := webhookTarget(t, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		c.Name = "first"
		c.Webhooks[0].ClientConfig.Service = &admissionregistrationv1.ServiceReference{Namespace: "cert", Name: "manager-webhook", Port: ptr.To[int32](443)}
	})
	second := webhookTarget(t, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		c.Name = "second"
		c.Webhooks[0].ClientConfig.Service = &admissionregistrationv1.ServiceReference{Namespace: "cert-manager", Name: "webhook", Port: ptr.To[int32](443)}
	})
	p := MakePlan(Input{Bridge: gwb, Targets: []Target{first, second},
		GuestServices: []corev1.Service{chartService("cert", "manager-webhook", 443), chartService("cert-manager", "webhook", 443)}})

	g.Expect(p.Backends).To(HaveLen(2))
	g.Expect(p.Backends[0].HostService).To(Equal(gwb.Spec.ClusterName + "-cert-manager-webhook"))
	g.Expect(p.Backends[1].HostService).To(HavePrefix(gwb.Spec.ClusterName + "-cert-manager-webhook-"))
	g.Expect(p.Targets[0].URL).NotTo(Equal(p.Targets[1].URL))
}
