package status

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func newGuestIngress() *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "ingress", Generation: 3},
		Spec:       guestnetv1.GuestIngressSpec{ClusterName: "guest"},
	}
}

func TestSetReadyCondition(t *testing.T) {
	trueCondition := func(t string) metav1.Condition {
		return metav1.Condition{Type: t, Status: metav1.ConditionTrue, Reason: "Fine"}
	}
	falseCondition := func(t, message string) metav1.Condition {
		return metav1.Condition{Type: t, Status: metav1.ConditionFalse, Reason: "Broken", Message: message}
	}

	tests := []struct {
		name        string
		conditions  []metav1.Condition
		deleting    bool
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantMessage string
	}{
		{
			name:       "all summarised conditions True",
			conditions: []metav1.Condition{trueCondition("A"), trueCondition("B")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.ReadyReason,
		},
		{
			name:       "one False",
			conditions: []metav1.Condition{trueCondition("A"), falseCondition("B", "fix B")},
			wantStatus: metav1.ConditionFalse, wantReason: "Broken", wantMessage: "fix B",
		},
		{
			name:       "two False: the reason of the first in the summary's order",
			conditions: []metav1.Condition{falseCondition("B", "fix B"), {Type: "A", Status: metav1.ConditionFalse, Reason: "BrokenFirst", Message: "fix A"}},
			wantStatus: metav1.ConditionFalse, wantReason: "BrokenFirst", wantMessage: "* A: fix A\n* B: fix B",
		},
		{
			name:       "False wins over Unknown",
			conditions: []metav1.Condition{{Type: "A", Status: metav1.ConditionUnknown, Reason: "Hm"}, falseCondition("B", "fix B")},
			wantStatus: metav1.ConditionFalse, wantReason: "Broken",
		},
		{
			name:       "one not reported yet",
			conditions: []metav1.Condition{trueCondition("A")},
			wantStatus: metav1.ConditionUnknown, wantReason: guestnetv1.NotReadyReason, wantMessage: "B: Condition not yet reported",
		},
		{
			name:       "conditions outside the summary do not count",
			conditions: []metav1.Condition{trueCondition("A"), trueCondition("B"), falseCondition("C", "ignored")},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.ReadyReason,
		},
		{
			name:       "deleting wins",
			conditions: []metav1.Condition{trueCondition("A"), trueCondition("B")},
			deleting:   true,
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.DeletingReason, wantMessage: "Being deleted",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := newGuestIngress()
			obj.Status.Conditions = tt.conditions
			if tt.deleting {
				obj.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			}

			SetReadyCondition(obj, "A", "B")

			c := conditions.Get(obj, guestnetv1.ReadyCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			g.Expect(c.Message).To(ContainSubstring(tt.wantMessage))
		})
	}
}

func TestSetReadyConditionWithoutTypesIsAnInternalError(t *testing.T) {
	g := NewWithT(t)
	obj := newGuestIngress()

	SetReadyCondition(obj)

	g.Expect(conditions.GetReason(obj, guestnetv1.ReadyCondition)).To(Equal(guestnetv1.InternalErrorReason))
}

func TestBound(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Bound("short", 10)).To(Equal("short"))
	g.Expect(Bound("ééééé", 8)).To(Equal("éé..."), "cut at a rune boundary")
}
