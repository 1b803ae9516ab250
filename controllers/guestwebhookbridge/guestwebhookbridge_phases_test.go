package guestwebhookbridge

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
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
	bridge := &guestnetv1.GuestWebhookBridge{ObjectMeta: metav1.ObjectMeta{
		DeletionTimestamp: &metav1.Time{Time: time.Now()},
		Finalizers:        []string{guestnetv1.GuestWebhookBridgeFinalizer, "someone.else/finalizer"},
	}}

	// Without a Cluster there is no guest to restore anything in: only host Services go.
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	_, err := (&Reconciler{Client: c}).reconcileDelete(context.Background(), &scope{bridge: bridge})

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bridge.Finalizers).To(Equal([]string{"someone.else/finalizer"}))
}
