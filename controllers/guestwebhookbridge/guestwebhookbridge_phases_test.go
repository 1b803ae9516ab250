package guestwebhookbridge

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	guestnetscheme "github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

func condition(conditionType string, status metav1.ConditionStatus) metav1.Condition {
	return metav1.Condition{Type: conditionType, Status: status, Reason: "Test"}
}

func TestSetReadyCondition(t *testing.T) {
	allTrue := func() []metav1.Condition {
		var cs []metav1.Condition
		for _, conditionType := range readyConditions {
			cs = append(cs, condition(conditionType, metav1.ConditionTrue))
		}
		return cs
	}

	tests := []struct {
		name       string
		conditions []metav1.Condition
		wantStatus metav1.ConditionStatus
	}{
		{
			// Until the targets are reported, a reachable Cluster alone is not Ready.
			name:       "only ClusterAvailable reported",
			conditions: []metav1.Condition{condition(guestnetv1.ClusterAvailableCondition, metav1.ConditionTrue)},
			wantStatus: metav1.ConditionUnknown,
		},
		{
			name:       "every summarised condition True",
			conditions: allTrue(),
			wantStatus: metav1.ConditionTrue,
		},
		{
			name:       "a target unreachable",
			conditions: append(allTrue()[:2], condition(guestnetv1.TargetsReachableCondition, metav1.ConditionFalse)),
			wantStatus: metav1.ConditionFalse,
		},
		{
			name:       "Paused is not summarised",
			conditions: append(allTrue(), condition(guestnetv1.PausedCondition, metav1.ConditionTrue)),
			wantStatus: metav1.ConditionTrue,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			bridge := &guestnetv1.GuestWebhookBridge{Status: guestnetv1.GuestWebhookBridgeStatus{Conditions: tt.conditions}}

			setReadyCondition(bridge)

			g.Expect(conditions.Get(bridge, guestnetv1.ReadyCondition).Status).To(Equal(tt.wantStatus))
		})
	}
}

func TestOwnedConditions(t *testing.T) {
	g := NewWithT(t)
	g.Expect(ownedConditions).To(ContainElements(guestnetv1.ReadyCondition, guestnetv1.PausedCondition))
	g.Expect(ownedConditions).To(ContainElements(readyConditions))
}

func TestReconcileDeleteReleasesTheObject(t *testing.T) {
	g := NewWithT(t)
	bridge := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "k0smotron", Name: "webhooks",
			DeletionTimestamp: &metav1.Time{Time: time.Now()},
			Finalizers:        []string{guestnetv1.GuestWebhookBridgeFinalizer, "someone.else/finalizer"},
		},
		Spec: guestnetv1.GuestWebhookBridgeSpec{ClusterName: "tenant-a"},
	}

	// Without a Cluster there is no guest to restore anything in: only host Services go.
	c := fake.NewClientBuilder().WithScheme(guestnetscheme.New()).WithObjects(bridge.DeepCopy()).Build()
	r := &Reconciler{Client: c, APIReader: c}
	_, err := r.reconcileDelete(context.Background(), &scope{bridge: bridge, original: bridge.DeepCopy()})

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bridge.Finalizers).To(Equal([]string{"someone.else/finalizer"}))
}

// The memo reuses an answer for the same inputs until recheckAfter (a probe no server
// answered, with backoff from 5s), and asks again for other inputs or later.
func TestMemo(t *testing.T) {
	g := NewWithT(t)
	now := time.Unix(1000, 0)
	m := newMemo()
	m.now = func() time.Time { return now }
	m.storeProbe("uid", "target", "inputs-1", bridge.ProbeResult{Answered: true, Verified: true})
	_, _, ok := m.probe("uid", "target", "inputs-1")
	g.Expect(ok).To(BeTrue())
	_, _, ok = m.probe("uid", "target", "inputs-2")
	g.Expect(ok).To(BeFalse(), "inputs changed")
	now = now.Add(recheckAfter)
	_, _, ok = m.probe("uid", "target", "inputs-1")
	g.Expect(ok).To(BeFalse(), "the safety recheck")

	// A probe no server answered is asked again after 5s, 10s, 20s, ... for the same inputs, up
	// to recheckAfter; a server's answer, even a failing one, is kept recheckAfter.
	refused := bridge.ProbeResult{Detail: "connection refused"}
	for _, want := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second} {
		_, kept := m.storeProbe("uid", "target", "inputs-1", refused)
		g.Expect(kept).To(Equal(want))
		_, left, ok := m.probe("uid", "target", "inputs-1")
		g.Expect(ok).To(BeTrue())
		g.Expect(left).To(Equal(want))
		now = now.Add(want)
		_, _, ok = m.probe("uid", "target", "inputs-1")
		g.Expect(ok).To(BeFalse(), "asked again after %s", want)
	}
	for range 10 {
		m.storeProbe("uid", "target", "inputs-1", refused)
	}
	_, kept := m.storeProbe("uid", "target", "inputs-1", refused)
	g.Expect(kept).To(Equal(recheckAfter))
	_, kept = m.storeProbe("uid", "target", "inputs-2", refused)
	g.Expect(kept).To(Equal(5*time.Second), "other inputs start over")
	_, kept = m.storeProbe("uid", "target", "inputs-2", bridge.ProbeResult{Answered: true, Detail: "certificate expired"})
	g.Expect(kept).To(Equal(recheckAfter))

	// While a target stays unanswered for the same inputs, the first failure's detail is kept:
	// a datapath that refuses, then resets, then times out would otherwise rewrite the status
	// at every probe, with nothing for the user to act on that the first message did not say.
	m.storeProbe("uid", "flaky", "inputs-1", refused)
	for _, detail := range []string{"EOF", "no answer within 5s"} {
		stored, _ := m.storeProbe("uid", "flaky", "inputs-1", bridge.ProbeResult{Detail: detail})
		g.Expect(stored.Detail).To(Equal("connection refused"))
		r, _, ok := m.probe("uid", "flaky", "inputs-1")
		g.Expect(ok).To(BeTrue())
		g.Expect(r.Detail).To(Equal("connection refused"))
	}
	stored, _ := m.storeProbe("uid", "flaky", "inputs-2", bridge.ProbeResult{Detail: "EOF"})
	g.Expect(stored.Detail).To(Equal("EOF"), "other inputs: a new failure")
	stored, _ = m.storeProbe("uid", "flaky", "inputs-2", bridge.ProbeResult{Answered: true, Detail: "certificate expired"})
	g.Expect(stored.Detail).To(Equal("certificate expired"), "an answer is never replaced")
	stored, _ = m.storeProbe("uid", "flaky", "inputs-2", bridge.ProbeResult{Detail: "connection refused"})
	g.Expect(stored.Detail).To(Equal("connection refused"), "unanswered after an answer: a new failure")

	reads := 0
	read := func() (any, error) { reads++; return reads, nil }
	v, _ := m.readFor("k", recheckAfter, read)
	v2, _ := m.readFor("k", recheckAfter, read)
	g.Expect(v2).To(Equal(v))
	now = now.Add(recheckAfter)
	v3, _ := m.readFor("k", recheckAfter, read)
	g.Expect(v3).NotTo(Equal(v))
}
