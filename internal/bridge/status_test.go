package bridge

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// bridgedPlan is the plan of the field report's guest in mode Always: cert-manager's
// validating webhook (weakened by the field report's workaround) and metrics-server's
// APIService through the bridge, plus a target that is not in the guest.
func bridgedPlan(t *testing.T) (*guestnetv1.GuestWebhookBridge, *Plan) {
	t.Helper()
	gwb := newBridge(always)
	weak := webhookTarget(t, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		c.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
	})
	targets := []Target{apiServiceTarget(t, metricsAPIService()), weak}
	return gwb, MakePlan(Input{Bridge: gwb, Targets: targets, GuestServices: defaultGuestServices()})
}

func TestSetProbe(t *testing.T) {
	const addr = "10.96.40.7:443"
	tests := []struct {
		name        string
		api         bool // the APIService target, else the webhook
		result      ProbeResult
		wantReason  string
		wantOK      bool
		wantMessage []string
	}{
		{
			name:       "nothing answers",
			result:     ProbeResult{Detail: "dial tcp 10.96.40.7:443: connect: connection refused"},
			wantReason: guestnetv1.EndpointUnreachableReason,
			wantMessage: []string{
				"no answer through host Service k0smotron/" + cmHostService + " (10.96.40.7:443): dial tcp 10.96.40.7:443: connect: connection refused.",
				"kubectl get endpointslices -n k0smotron -l kubernetes.io/service-name=" + cmHostService,
				"the worker virt-launcher pods capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher",
				"the workers declare nodePort 32700 (condition PortsDeclared)",
				"the pods behind cert-manager/cert-manager-webhook:443 are ready in the guest",
			},
		},
		{
			name: "insecure APIService answers", api: true,
			result:      ProbeResult{Answered: true, Insecure: true, DNSNames: []string{"localhost"}},
			wantOK:      true,
			wantMessage: []string{"answers through the bridge (certificate not verified: insecureSkipTLSVerify)"},
		},
		{
			name: "insecure APIService, nothing answers", api: true,
			result:     ProbeResult{Insecure: true, Detail: "no answer within 5s"},
			wantReason: guestnetv1.EndpointUnreachableReason,
			wantMessage: []string{
				"host Service k0smotron/" + msHostService, "no answer within 5s", "nodePort 32701", "kube-system/metrics-server:443",
			},
		},
		{
			name:       "cert-manager's certificate lacks the bridge's name",
			result:     ProbeResult{Answered: true, NameMissing: true, DNSNames: []string{"cert-manager-webhook", "cert-manager-webhook.cert-manager.svc"}, IPs: []string{"10.0.2.2"}},
			wantReason: guestnetv1.TLSNameMismatchReason,
			wantMessage: []string{
				"its certificate carries [cert-manager-webhook cert-manager-webhook.cert-manager.svc 10.0.2.2] but not " + cmHostService + ".k0smotron.svc",
				"chart value webhook.url.host=" + cmHostService + ".k0smotron.svc",
			},
		},
		{
			name: "APIService certificate lacks the name", api: true,
			result:      ProbeResult{Answered: true, NameMissing: true},
			wantReason:  guestnetv1.TLSNameMismatchReason,
			wantMessage: []string{"its certificate carries no names but not metrics-server-guestnet.kube-system.svc"},
		},
		{
			name:        "untrusted certificate",
			result:      ProbeResult{Answered: true, Detail: "certificate does not verify against the caBundle: x509: certificate signed by unknown authority"},
			wantReason:  guestnetv1.TLSUnverifiedReason,
			wantMessage: []string{"answers through the bridge, but certificate does not verify against the caBundle: x509: certificate signed by unknown authority"},
		},
		{
			name:        "verified",
			result:      ProbeResult{Answered: true, Verified: true},
			wantOK:      true,
			wantMessage: []string{"answers through the bridge with a certificate valid for " + cmHostService + ".k0smotron.svc"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			gwb, p := bridgedPlan(t)
			tp := &p.Targets[1]
			if tt.api {
				tp = &p.Targets[0]
				g.Expect(tp.IsWebhook()).To(BeFalse())
			}
			tp.SetProbe(tt.result, gwb, addr)
			g.Expect(tp.Reason).To(Equal(tt.wantReason))
			g.Expect(tp.Probe).NotTo(BeNil())
			g.Expect(tp.Probe.OK()).To(Equal(tt.wantOK))
			for _, m := range tt.wantMessage {
				g.Expect(tp.Message).To(ContainSubstring(m))
			}
			if tt.api {
				g.Expect(tp.Message).NotTo(ContainSubstring("webhook.url.host"), "no cert-manager hint for an APIService")
			}
		})
	}
}

func TestProbeResultOK(t *testing.T) {
	for _, tt := range []struct {
		r    ProbeResult
		want bool
	}{
		{ProbeResult{}, false},
		{ProbeResult{Answered: true}, false},
		{ProbeResult{Answered: true, NameMissing: true}, false},
		{ProbeResult{Answered: true, Verified: true}, true},
		{ProbeResult{Answered: true, Insecure: true}, true},
		{ProbeResult{Insecure: true}, false},
	} {
		NewWithT(t).Expect(tt.r.OK()).To(Equal(tt.want), "%+v", tt.r)
	}
}

func TestTargetStatuses(t *testing.T) {
	g := NewWithT(t)
	gwb, p := bridgedPlan(t)
	p.Targets = append(p.Targets, MakePlan(Input{Bridge: gwb, Targets: []Target{
		{Kind: guestnetv1.MutatingWebhookTarget, Name: "not-there"},
	}}).Targets...)
	p.Targets[1].SetProbe(ProbeResult{Answered: true, Verified: true}, gwb, "10.96.0.1:443")
	p.Targets[0].SetProbe(ProbeResult{Detail: "refused"}, gwb, "10.96.0.2:443")

	got := TargetStatuses(p)
	g.Expect(got).To(HaveLen(3))
	g.Expect(got[0]).To(Equal(guestnetv1.TargetStatus{
		Kind: guestnetv1.APIServiceTarget, Name: metricsAPI,
		GuestService: "kube-system/metrics-server", NodePort: 32701, HostService: msHostService,
		TLSServerName: "metrics-server-guestnet.kube-system.svc",
		Bridged:       true, Reachable: ptr.To(false),
		Message: p.Targets[0].Message + "; " + p.Targets[0].Warnings[0],
	}))
	g.Expect(got[0].Message).To(HavePrefix("no answer through host Service"))
	g.Expect(got[1]).To(Equal(guestnetv1.TargetStatus{
		Kind: guestnetv1.ValidatingWebhookTarget, Name: cmSvc, Webhook: cmWebhook,
		GuestService: "cert-manager/cert-manager-webhook", NodePort: 32700, HostService: cmHostService,
		URL: cmValidateURL, TLSServerName: cmHostService + ".k0smotron.svc",
		Bridged: true, Reachable: ptr.To(true),
		Message: "answers through the bridge with a certificate valid for " + cmHostService + ".k0smotron.svc; " +
			"failurePolicy is Ignore: requests pass unchecked whenever the webhook fails; with the bridge in place, set it back to Fail (the chart default)",
	}))
	g.Expect(got[2]).To(Equal(guestnetv1.TargetStatus{
		Kind: guestnetv1.MutatingWebhookTarget, Name: "not-there",
		Message: "MutatingWebhookConfiguration not-there does not exist in the guest; guestnet bridges it once it is created",
	}))

	// A bridged target not probed (yet) has no message of its own: its warnings alone.
	_, p = bridgedPlan(t)
	got = TargetStatuses(p)
	g.Expect(got[1].Reachable).To(BeNil())
	g.Expect(got[1].Message).To(HavePrefix("failurePolicy is Ignore"))
	g.Expect(got[0].Message).To(HavePrefix("insecureSkipTLSVerify is true"))

	g.Expect(TargetStatuses(&Plan{})).To(BeEmpty())
}

func TestCounts(t *testing.T) {
	g := NewWithT(t)
	_, p := bridgedPlan(t)
	bridged, total := Counts(p)
	g.Expect(bridged).To(Equal(int32(2)))
	g.Expect(total).To(Equal(int32(2)))
	p.Targets[0].Bridged = false
	bridged, total = Counts(p)
	g.Expect(bridged).To(Equal(int32(1)))
	g.Expect(total).To(Equal(int32(2)))
	bridged, total = Counts(&Plan{})
	g.Expect(bridged).To(BeZero())
	g.Expect(total).To(BeZero())
}

// tp is a target plan with just what the conditions read.
func tp(name string, bridged bool, reason, message string, warnings ...string) TargetPlan {
	return TargetPlan{
		Target:  Target{Kind: guestnetv1.ValidatingWebhookTarget, Name: name, Webhook: name + ".io", Found: true},
		Bridged: bridged, Reason: reason, Message: message, Warnings: warnings,
	}
}

func probed(p TargetPlan, ok bool) TargetPlan {
	p.Probe = &ProbeResult{Answered: true, Verified: ok}
	return p
}

func TestSetTargetsBridgedCondition(t *testing.T) {
	var many []TargetPlan
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		many = append(many, tp(n, false, guestnetv1.TargetNotFoundReason, n+" is missing"))
	}
	tests := []struct {
		name        string
		targets     []TargetPlan
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantMessage string
		wantNot     string
	}{
		{
			name: "no targets", wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.NoTargetsReason,
			wantMessage: "No guest APIService or webhook configuration matches the selection yet",
		},
		{
			name:       "all bridged",
			targets:    []TargetPlan{tp("a", true, "", ""), tp("b", true, "", "")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.TargetsBridgedReason,
			wantMessage: "2 of 2 targets bridged", wantNot: "left alone",
		},
		{
			name:       "one left alone for a reason that needs nothing",
			targets:    []TargetPlan{tp("a", true, "", ""), tp("b", false, "", "has clientConfig.url already")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.TargetsBridgedReason,
			wantMessage: "1 of 2 targets bridged; 1 left alone (see status.targets)",
		},
		{
			name:       "warnings appear",
			targets:    []TargetPlan{tp("a", true, "", "", "failurePolicy is Ignore", "timeoutSeconds is 5")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.TargetsBridgedReason,
			wantMessage: "1 of 1 targets bridged. Warnings: ValidatingWebhookConfiguration a, webhook a.io: failurePolicy is Ignore; " +
				"ValidatingWebhookConfiguration a, webhook a.io: timeoutSeconds is 5",
		},
		{
			name: "the most actionable reason first",
			targets: []TargetPlan{
				tp("a", false, guestnetv1.TargetNotFoundReason, "a is missing"),
				tp("b", false, guestnetv1.WaitingForAvailabilityReason, "b waits"),
				tp("c", true, "", ""),
				tp("d", false, guestnetv1.TargetClaimedReason, "d is claimed"),
			},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.TargetClaimedReason,
			wantMessage: "3 of 4 targets not bridged: ValidatingWebhookConfiguration d, webhook d.io: d is claimed; " +
				"ValidatingWebhookConfiguration a, webhook a.io: a is missing; ValidatingWebhookConfiguration b, webhook b.io: b waits",
		},
		{
			name: "reason order: host conflict, not bridgeable, exhausted, nodePort conflict, Service not found",
			targets: []TargetPlan{
				tp("a", false, guestnetv1.GuestServiceNotFoundReason, "m"),
				tp("b", false, guestnetv1.NodePortConflictReason, "m"),
				tp("c", false, guestnetv1.NodePortRangeExhaustedReason, "m"),
				tp("d", false, guestnetv1.TargetNotBridgeableReason, "m"),
				tp("e", false, guestnetv1.HostObjectConflictReason, "m"),
			},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.HostObjectConflictReason,
			wantMessage: "5 of 5 targets not bridged: ValidatingWebhookConfiguration e, webhook e.io: m; ValidatingWebhookConfiguration d, webhook d.io: m; " +
				"ValidatingWebhookConfiguration c, webhook c.io: m; ValidatingWebhookConfiguration b, webhook b.io: m; ValidatingWebhookConfiguration a, webhook a.io: m",
		},
		{
			name:       "only waiting for the aggregator",
			targets:    []TargetPlan{tp("a", false, guestnetv1.WaitingForAvailabilityReason, "waiting")},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.WaitingForAvailabilityReason,
			wantMessage: "1 of 1 targets not bridged",
		},
		{
			name:       "long lists are cut",
			targets:    many,
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.TargetNotFoundReason,
			wantMessage: "7 of 7 targets not bridged: ValidatingWebhookConfiguration a, webhook a.io: a is missing; ",
			wantNot:     "f is missing",
		},
		{
			name:       "a probe's problem is not a bridging problem",
			targets:    []TargetPlan{tp("a", true, guestnetv1.EndpointUnreachableReason, "no answer")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.TargetsBridgedReason,
			wantMessage: "1 of 1 targets bridged",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			gwb := newBridge()
			SetTargetsBridgedCondition(gwb, &Plan{Targets: tt.targets})
			c := meta.FindStatusCondition(gwb.Status.Conditions, guestnetv1.TargetsBridgedCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			g.Expect(c.Message).To(ContainSubstring(tt.wantMessage))
			if tt.wantNot != "" {
				g.Expect(c.Message).NotTo(ContainSubstring(tt.wantNot))
			}
			if len(tt.targets) > maxListed {
				g.Expect(c.Message).To(HaveSuffix("and 2 more (see status.targets)"))
				g.Expect(strings.Count(c.Message, " is missing")).To(Equal(maxListed))
			}
		})
	}
}

func TestSetTargetsReachableCondition(t *testing.T) {
	tests := []struct {
		name        string
		targets     []TargetPlan
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantMessage string
	}{
		{
			name:       "nothing probed",
			targets:    []TargetPlan{tp("a", true, "", "left alone"), tp("b", false, guestnetv1.TargetNotFoundReason, "missing")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.NoTargetsReason,
			wantMessage: "No target goes through the bridge",
		},
		{
			name:       "all answer",
			targets:    []TargetPlan{probed(tp("a", true, "", ""), true), probed(tp("b", true, "", "", "timeoutSeconds is 5"), true), tp("c", true, "", "")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.TargetsReachableReason,
			wantMessage: "2 bridged targets answer from the host network, as the guest apiserver will call them. Warnings: ValidatingWebhookConfiguration b, webhook b.io: timeoutSeconds is 5",
		},
		{
			name: "unreachable first, then unverified, then name mismatch",
			targets: []TargetPlan{
				probed(tp("a", true, guestnetv1.TLSNameMismatchReason, "lacks the name"), false),
				probed(tp("b", true, guestnetv1.TLSUnverifiedReason, "unknown authority"), false),
				probed(tp("c", true, guestnetv1.EndpointUnreachableReason, "no answer"), false),
				probed(tp("d", true, "", ""), true),
			},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.EndpointUnreachableReason,
			wantMessage: "3 of 4 bridged targets cannot be called: ValidatingWebhookConfiguration c, webhook c.io: no answer; " +
				"ValidatingWebhookConfiguration b, webhook b.io: unknown authority; ValidatingWebhookConfiguration a, webhook a.io: lacks the name",
		},
		{
			name:       "name mismatch only",
			targets:    []TargetPlan{probed(tp("a", true, guestnetv1.TLSNameMismatchReason, "lacks the name"), false)},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.TLSNameMismatchReason,
			wantMessage: "1 of 1 bridged targets cannot be called",
		},
		{
			name:       "a bridging problem is not a reachability problem",
			targets:    []TargetPlan{probed(tp("a", true, "", ""), true), tp("b", false, guestnetv1.TargetClaimedReason, "claimed")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.TargetsReachableReason,
			wantMessage: "1 bridged targets answer",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			gwb := newBridge()
			SetTargetsReachableCondition(gwb, &Plan{Targets: tt.targets})
			c := meta.FindStatusCondition(gwb.Status.Conditions, guestnetv1.TargetsReachableCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			g.Expect(c.Message).To(ContainSubstring(tt.wantMessage))
		})
	}
}

// The conditions of a real plan, probed as the controller does it.
func TestConditionsOfAPlan(t *testing.T) {
	g := NewWithT(t)
	gwb, p := bridgedPlan(t)
	p.Targets[0].SetProbe(ProbeResult{Answered: true, Insecure: true}, gwb, "10.96.0.2:443")
	p.Targets[1].SetProbe(ProbeResult{Answered: true, NameMissing: true, DNSNames: []string{"cert-manager-webhook.cert-manager.svc"}}, gwb, "10.96.0.1:443")
	SetTargetsBridgedCondition(gwb, p)
	SetTargetsReachableCondition(gwb, p)

	bridged := meta.FindStatusCondition(gwb.Status.Conditions, guestnetv1.TargetsBridgedCondition)
	g.Expect(bridged.Status).To(Equal(metav1.ConditionTrue))
	g.Expect(bridged.Message).To(ContainSubstring("2 of 2 targets bridged"))
	g.Expect(bridged.Message).To(ContainSubstring("Warnings: APIService v1beta1.metrics.k8s.io: insecureSkipTLSVerify is true"))
	g.Expect(bridged.Message).To(ContainSubstring("webhook webhook.cert-manager.io: failurePolicy is Ignore"))

	reachable := meta.FindStatusCondition(gwb.Status.Conditions, guestnetv1.TargetsReachableCondition)
	g.Expect(reachable.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(reachable.Reason).To(Equal(guestnetv1.TLSNameMismatchReason))
	g.Expect(reachable.Message).To(ContainSubstring("1 of 2 bridged targets cannot be called"))
	g.Expect(reachable.Message).To(ContainSubstring("webhook.url.host=" + cmHostService + ".k0smotron.svc"))
}
