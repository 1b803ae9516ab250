package record

import (
	"context"

	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
)

func TestConditionChanges(t *testing.T) {
	notPaused := metav1.Condition{Type: guestnetv1.PausedCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.NotPausedReason}
	paused := metav1.Condition{Type: guestnetv1.PausedCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.PausedReason, Message: "Cluster guest has spec.paused set to true"}
	notFound := metav1.Condition{Type: guestnetv1.ClusterAvailableCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.ClusterNotFoundReason, Message: "create it"}
	available := metav1.Condition{Type: guestnetv1.ClusterAvailableCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.ClusterAvailableReason}
	notProvisioned := metav1.Condition{Type: guestnetv1.ClusterAvailableCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.ClusterNotProvisionedReason}

	tests := []struct {
		name   string
		before []metav1.Condition
		after  []metav1.Condition
		want   []ConditionEvent
	}{
		{name: "nothing changed", before: []metav1.Condition{notPaused, available}, after: []metav1.Condition{notPaused, available}},
		{
			name:   "only the message changed",
			before: []metav1.Condition{notFound},
			after:  []metav1.Condition{{Type: notFound.Type, Status: notFound.Status, Reason: notFound.Reason, Message: "other"}},
		},
		{
			name:  "new conditions",
			after: []metav1.Condition{notPaused, notFound},
			want: []ConditionEvent{
				{Type: corev1.EventTypeNormal, Reason: guestnetv1.NotPausedReason, Action: "Reconcile", Note: "Paused is False"},
				{Type: corev1.EventTypeWarning, Reason: guestnetv1.ClusterNotFoundReason, Action: "Reconcile", Note: "ClusterAvailable is False: create it"},
			},
		},
		{
			name:   "pausing is Normal",
			before: []metav1.Condition{notPaused},
			after:  []metav1.Condition{paused},
			want: []ConditionEvent{
				{Type: corev1.EventTypeNormal, Reason: guestnetv1.PausedReason, Action: "Reconcile", Note: "Paused is True: Cluster guest has spec.paused set to true"},
			},
		},
		{
			name:   "reason changed, status did not",
			before: []metav1.Condition{notFound},
			after:  []metav1.Condition{notProvisioned},
			want: []ConditionEvent{
				{Type: corev1.EventTypeWarning, Reason: guestnetv1.ClusterNotProvisionedReason, Action: "Reconcile", Note: "ClusterAvailable is False"},
			},
		},
		{
			// Ready takes the reason of the condition it names: its own action keeps the
			// recorder from folding the two events into one.
			name:  "Ready has its own action",
			after: []metav1.Condition{notFound, {Type: guestnetv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.ClusterNotFoundReason}},
			want: []ConditionEvent{
				{Type: corev1.EventTypeWarning, Reason: guestnetv1.ClusterNotFoundReason, Action: "Reconcile", Note: "ClusterAvailable is False: create it"},
				{Type: corev1.EventTypeWarning, Reason: guestnetv1.ClusterNotFoundReason, Action: "Summarise", Note: "Ready is False"},
			},
		},
		{
			name:   "recovered",
			before: []metav1.Condition{notProvisioned},
			after:  []metav1.Condition{available},
			want: []ConditionEvent{
				{Type: corev1.EventTypeNormal, Reason: guestnetv1.ClusterAvailableReason, Action: "Reconcile", Note: "ClusterAvailable is True"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(ConditionChanges(tt.before, tt.after)).To(Equal(tt.want))
		})
	}
}

func TestConditionChangesTruncatesLongNotes(t *testing.T) {
	g := NewWithT(t)
	long := metav1.Condition{Type: "A", Status: metav1.ConditionFalse, Reason: "R", Message: strings.Repeat("x", 2000)}

	changes := ConditionChanges(nil, []metav1.Condition{long})

	g.Expect(changes).To(HaveLen(1))
	g.Expect(len(changes[0].Note)).To(Equal(maxEventNote))
	g.Expect(changes[0].Note).To(HaveSuffix("..."))
}

func TestConditions(t *testing.T) {
	g := NewWithT(t)
	recorder := events.NewFakeRecorder(10)
	obj := newGuestIngress()
	clusterscope.SetClusterAvailableCondition(obj, nil, nil)

	Conditions(context.Background(), recorder, obj, nil)

	g.Expect(recorder.Events).To(Receive(And(
		ContainSubstring(corev1.EventTypeWarning),
		ContainSubstring(guestnetv1.ClusterNotFoundReason),
		ContainSubstring(`No Cluster "guest"`),
	)))
	g.Expect(recorder.Events).NotTo(Receive())
}

func newGuestIngress() *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "ingress", Generation: 3},
		Spec:       guestnetv1.GuestIngressSpec{ClusterName: "guest"},
	}
}
