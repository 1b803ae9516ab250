package guestingress

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
			// Until the host exposure is reported, a reachable Cluster alone is not Ready.
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
			name:       "no endpoints",
			conditions: append(allTrue()[:3], condition(guestnetv1.EndpointsReadyCondition, metav1.ConditionFalse)),
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
			gi := &guestnetv1.GuestIngress{Status: guestnetv1.GuestIngressStatus{Conditions: tt.conditions}}

			setReadyCondition(gi)

			g.Expect(conditions.Get(gi, guestnetv1.ReadyCondition).Status).To(Equal(tt.wantStatus))
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
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{
		DeletionTimestamp: &metav1.Time{Time: time.Now()},
		Finalizers:        []string{guestnetv1.GuestIngressFinalizer, "someone.else/finalizer"},
	}}

	_, err := (&Reconciler{}).reconcileDelete(context.Background(), &scope{guestIngress: gi})

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gi.Finalizers).To(Equal([]string{"someone.else/finalizer"}))
}
