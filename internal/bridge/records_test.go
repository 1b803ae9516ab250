package bridge

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// snapshot is what a test compares of a simulated guest: the three objects and the records.
func (s *guestSim) snapshot(t *testing.T) string {
	return mustJSON(t, []any{s.obs, s.gwb.Status.Records})
}

func (s *guestSim) validating() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &s.obs.ValidatingWebhooks[0]
}

// Either copy of a record is re-derived from the other; only a target whose two copies are
// both gone is left alone, with its Services, and only that target.
func TestConvergeRecordCopies(t *testing.T) {
	g := NewWithT(t)
	s := fieldReportGuest(t)
	original := s.snapshot(t)
	s.reconcile(g)
	bridged := s.snapshot(t)
	record := s.validating().Annotations[guestnetv1.BridgeOriginalAnnotation]
	hostCopy := s.gwb.Status.Records
	g.Expect(hostCopy).To(HaveLen(3))

	for _, damage := range []struct {
		name  string
		apply func()
	}{
		{"annotation removed", func() { delete(s.validating().Annotations, guestnetv1.BridgeOriginalAnnotation) }},
		{"annotation not JSON", func() { s.validating().Annotations[guestnetv1.BridgeOriginalAnnotation] = "not json" }},
		{"entry damaged", func() {
			s.validating().Annotations[guestnetv1.BridgeOriginalAnnotation] = `{"` + cmWebhook + `": {"bridge": "` + me + `", "original": 1, "written": "x"}}`
		}},
		{"host copy lost (status restored from a backup without it)", func() { s.gwb.Status.Records = nil }},
		{"host entry damaged", func() {
			s.gwb.Status.Records = append([]guestnetv1.BridgeRecord(nil), hostCopy...)
			s.gwb.Status.Records[2].Original = "damaged"
		}},
	} {
		damage.apply()
		p := s.reconcile(g)
		g.Expect(s.writes).To(Equal(1), damage.name)
		g.Expect(s.snapshot(t)).To(MatchJSON(bridged), "%s: re-derived from the other copy", damage.name)
		for _, tp := range p.Targets {
			g.Expect(tp.Reason).To(BeEmpty(), "%s: %s", damage.name, tp.Key())
		}
		s.reconcile(g)
		g.Expect(s.writes).To(BeZero(), damage.name)
	}

	// Both copies of the validating webhook's record gone: it points at the bridge, nobody
	// knows its original. It alone is RecordUnreadable; nothing is written or deleted.
	delete(s.validating().Annotations, guestnetv1.BridgeOriginalAnnotation)
	s.gwb.Status.Records = s.gwb.Status.Records[:2]
	services := len(s.services)
	p := s.reconcile(g)
	g.Expect(s.writes).To(BeZero())
	g.Expect(len(s.services)).To(Equal(services), "no Service goes while a target's Services are unknown")
	g.Expect(p.KeepServices).To(BeTrue())
	// With no record and a url, "all" no longer selects it: it is reported among the targets
	// the bridge would restore, and cannot.
	reasons := map[string]string{}
	for _, tp := range append(p.Targets, p.Restores...) {
		reasons[tp.Key()] = tp.Reason
	}
	g.Expect(reasons).To(Equal(map[string]string{
		"APIService/" + metricsAPI:                                  "",
		"MutatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook:   "",
		"ValidatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook: guestnetv1.RecordUnreadableReason,
	}))
	g.Expect(p.Restores[0].Message).To(ContainSubstring("no copy of its record can be read"))
	SetTargetsBridgedCondition(s.gwb, p)
	g.Expect(s.gwb.Status.Conditions[0].Reason).To(Equal(guestnetv1.RecordUnreadableReason))

	// The user puts the annotation back: healed.
	s.validating().Annotations[guestnetv1.BridgeOriginalAnnotation] = record
	s.reconcile(g)
	g.Expect(s.snapshot(t)).To(MatchJSON(bridged))

	// Deleting the bridge with the annotation removed again restores from the host copy.
	delete(s.validating().Annotations, guestnetv1.BridgeOriginalAnnotation)
	s.deleteBridge(g)
	g.Expect(mustJSON(t, []any{s.obs, s.gwb.Status.Records})).To(MatchJSON(original))
}

// A crash after any write of a reconcile (the host copy of the records, a guest object, the
// final host copy), then a restart: the bridge converges to the same guest, and deleting it
// restores every original exactly. The lab runs the same against real apiservers
// (TestGuestWebhookBridgeFaults).
func TestConvergeAfterACrashAtEveryWrite(t *testing.T) {
	recording := fieldReportGuest(t)
	g := NewWithT(t)
	original := recording.snapshot(t)
	recording.reconcile(g)
	want := recording.snapshot(t)
	recording.deleteBridge(g)
	writes := recording.total
	g.Expect(writes).To(BeNumerically(">", 8))

	for n := 1; n < writes; n++ {
		t.Run(fmt.Sprintf("crash after write %d of %d", n, writes), func(t *testing.T) {
			g := NewWithT(t)
			s := fieldReportGuest(t)
			s.crashAfter = n
			if s.survive(func() { s.reconcile(g) }) {
				s.reconcile(g) // the restarted controller
			}
			g.Expect(s.snapshot(t)).To(MatchJSON(want), "converged, nothing duplicated")
			s.reconcile(g)
			g.Expect(s.writes).To(BeZero(), "and stays")
			if s.survive(func() { s.deleteBridge(g) }) {
				s.deleteBridge(g)
			}
			g.Expect(s.snapshot(t)).To(MatchJSON(original), "every original back, no record left")
			for _, svc := range s.services {
				g.Expect(svc.Name).NotTo(ContainSubstring("guestnet"), "no Service of the bridge left")
			}
		})
	}
}

// limit keeps what the bridge rewrote, then the first by key; the rest is left out.
func TestMakePlanLimitsTheTargets(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge(always)
	var targets []Target
	for i := range guestnetv1.MaxTargets + 2 {
		c := vwc(fmt.Sprintf("config-%03d", i), nil, vwh(cmWebhook, whRef(cmNS, cmSvc, 443, "/validate")))
		targets = append(targets, WebhookTargets(&c)[0])
	}
	// The last one was rewritten by this bridge when the selection was smaller.
	last := vwc(fmt.Sprintf("config-%03d", guestnetv1.MaxTargets+1), nil, vwh(cmWebhook, whRef(cmNS, cmSvc, 443, "/validate")))
	url := cmValidateURL
	_, err := RewriteWebhook(&last, cmWebhook, url, NewRecord(WebhookTargets(&last)[0], me, url))
	g.Expect(err).NotTo(HaveOccurred())
	targets[guestnetv1.MaxTargets+1] = WebhookTargets(&last)[0]

	p := MakePlan(Input{Bridge: gwb, Targets: targets, GuestServices: defaultGuestServices()})
	g.Expect(p.Targets).To(HaveLen(guestnetv1.MaxTargets))
	g.Expect(p.Targets[len(p.Targets)-1].Name).To(Equal(last.Name), "what it rewrote stays in its care")
	g.Expect(p.LeftOut).To(HaveLen(2))
	g.Expect(p.LeftOut[0].Name).To(Equal("config-255"))
	g.Expect(p.LeftOut[1].Name).To(Equal("config-256"))
	g.Expect(p.Restores).To(BeEmpty(), "left out is not unselected: nothing is restored")

	SetTargetsBridgedCondition(gwb, p)
	c := gwb.Status.Conditions[0]
	g.Expect(c.Reason).To(Equal(guestnetv1.TooManyTargetsReason))
	g.Expect(c.Message).To(HavePrefix("258 targets match the selection; guestnet handles at most 256"))
	g.Expect(c.Message).To(ContainSubstring("left out: ValidatingWebhookConfiguration config-255, webhook " + cmWebhook))
	_, total := Counts(p)
	g.Expect(total).To(BeEquivalentTo(258))
	g.Expect(TargetStatuses(p)).To(HaveLen(guestnetv1.MaxTargets))
}

// A record of a bridge that no longer exists (its finalizer given up) claims nothing: the
// target is taken over with the recorded original, so that it is restored one day.
func TestMakePlanTakesOverARecordOfAGoneBridge(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge(always)
	target := webhookTarget(t, rewrittenBy(t, other, cmValidateURL))
	in := Input{Bridge: gwb, Targets: []Target{target}, GuestServices: defaultGuestServices(), Claimants: map[string]bool{other: true}}
	g.Expect(MakePlan(in).Targets[0].Reason).To(Equal(guestnetv1.TargetClaimedReason))

	in.Claimants[other] = false
	tp := MakePlan(in).Targets[0]
	g.Expect(tp.Reason).To(BeEmpty())
	g.Expect(tp.Action).To(Equal(RewriteAction))
	g.Expect(tp.TookOverFrom).To(Equal(other))
	g.Expect(tp.Desired.Bridge).To(Equal(me))
	g.Expect(string(tp.Desired.Original)).To(MatchJSON(mustJSON(t, whRef(cmNS, cmSvc, 443, "/validate"))))
	g.Expect(tp.Service).To(Equal(&ServiceRef{Namespace: cmNS, Name: cmSvc, Port: 443, Path: "/validate"}))

	// The gone bridge's NodePort Service is in the way only while that bridge exists: then it
	// is adopted (applied over), with its nodePort.
	orphan := bridgeNodePortService(t, newBridge(func(b *guestnetv1.GuestWebhookBridge) { b.Name = "other-bridge" }),
		chartService(cmNS, cmSvc, 443), map[int32]int32{443: 32705})
	in.GuestServices = append(defaultGuestServices(), orphan)
	tp = MakePlan(in).Targets[0]
	g.Expect(tp.Reason).To(BeEmpty())
	g.Expect(tp.Backend.NodePort(443)).To(Equal(int32(32705)))
	in.Claimants[other] = true
	g.Expect(MakePlan(in).Targets[0].Reason).To(Equal(guestnetv1.TargetClaimedReason))
	in.Targets = []Target{webhookTarget(t)}
	g.Expect(MakePlan(in).Targets[0].Reason).To(Equal(guestnetv1.HostObjectConflictReason), "an existing bridge's Service is never taken")
}

// The host copy holds a record from before the guest write, and keeps a restored target's
// record until the restore landed.
func TestHostRecordsAroundTheGuestWrites(t *testing.T) {
	g := NewWithT(t)
	s := fieldReportGuest(t)
	s.reconcile(g)
	// The mutating webhook is dropped and a new APIService selected in one change.
	s.gwb.Spec.MutatingWebhooks = nil
	s.obs.APIServices = append(s.obs.APIServices, *apiService("v1beta1.custom.metrics.k8s.io", apiRef(msNS, msSvc, 443), apiregistrationv1.ConditionFalse))
	s.obs.APIServices[2].ResourceVersion = "1"
	s.gwb.Spec.APIServices.Names = append(s.gwb.Spec.APIServices.Names, "v1beta1.custom.metrics.k8s.io")
	in := s.input(g)
	targets, err := Select(&s.gwb.Spec, s.obs, in.Host)
	g.Expect(err).NotTo(HaveOccurred())
	in.Targets = targets
	p := MakePlan(in)
	keys := sortedKeys[guestnetv1.BridgeRecord]
	g.Expect(keys(p.PendingHostRecords())).To(Equal([]string{
		"APIService/v1beta1.custom.metrics.k8s.io", "APIService/" + metricsAPI,
		"MutatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook, "ValidatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook,
	}), "before the guest writes: the new record, and the one being restored")
	g.Expect(keys(p.HostRecords())).To(Equal([]string{
		"APIService/v1beta1.custom.metrics.k8s.io", "APIService/" + metricsAPI, "ValidatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook,
	}), "after")
	g.Expect(p.Restores).To(HaveLen(1))
	g.Expect(p.Restores[0].Action).To(Equal(RestoreAction))
	g.Expect(p.Restores[0].Rewritten).To(BeTrue())
}

// Deleting with a target whose records cannot be read at all: the other targets are
// restored, that one is reported and left.
func TestPlanDeletionWithAnUnreadableRecord(t *testing.T) {
	g := NewWithT(t)
	s := fieldReportGuest(t)
	s.reconcile(g)
	s.validating().Annotations[guestnetv1.BridgeOriginalAnnotation] = "{"
	s.gwb.Status.Records = s.gwb.Status.Records[:2]
	p := PlanDeletion(s.input(g))
	reasons := map[string]string{}
	for _, tp := range p.Restores {
		reasons[tp.Key()] = tp.Reason
	}
	g.Expect(reasons).To(Equal(map[string]string{
		"APIService/" + metricsAPI:                                  "",
		"MutatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook:   "",
		"ValidatingWebhookConfiguration/" + cmSvc + "/" + cmWebhook: guestnetv1.RecordUnreadableReason,
	}))
	s.writeTargets(g, p)
	g.Expect(s.obs.MutatingWebhooks[0].Webhooks[0].ClientConfig.Service).NotTo(BeNil())
	g.Expect(s.validating().Webhooks[0].ClientConfig.URL).To(Equal(ptr.To(cmValidateURL)), "left as it is")
}
