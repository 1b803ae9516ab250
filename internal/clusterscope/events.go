package clusterscope

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// eventAction is the events.k8s.io action of every condition event: the reconcile noticed it.
// Ready's events have their own (readyEventAction): Ready takes the reason of the condition it
// names, and the recorder folds events of the same type, reason and action into one.
const (
	eventAction      = "Reconcile"
	readyEventAction = "Summarise"
)

// maxEventNote keeps a note well below the 1 kB events.k8s.io allows.
const maxEventNote = 512

// ConditionEvent is the event that reports one condition change.
type ConditionEvent struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason is the condition's new reason.
	Reason string
	// Action is the events.k8s.io action: Summarise for Ready, Reconcile for the others.
	Action string
	// Note says which condition changed to what, and why.
	Note string
}

// ConditionChanges returns one event per condition whose status or reason differs between
// before and after (a new condition counts as a change; a changed message alone does not,
// so a reconcile loop cannot flood the event stream).
func ConditionChanges(before, after []metav1.Condition) []ConditionEvent {
	var changes []ConditionEvent
	for _, c := range after {
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		note := fmt.Sprintf("%s is %s", c.Type, c.Status)
		if c.Message != "" {
			note += ": " + c.Message
		}
		if len(note) > maxEventNote {
			note = note[:maxEventNote-3] + "..."
		}
		action := eventAction
		if c.Type == guestnetv1.ReadyCondition {
			action = readyEventAction
		}
		changes = append(changes, ConditionEvent{Type: eventType(c), Reason: c.Reason, Action: action, Note: note})
	}
	return changes
}

// eventType is Warning when the condition reports a problem the user may have to act on.
// Paused=True is deliberate (set by the user or clusterctl), so it is Normal.
func eventType(c metav1.Condition) string {
	if c.Status == metav1.ConditionFalse && c.Type != guestnetv1.PausedCondition {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// RecordConditionChanges records an event on obj for each condition that changed since
// before, so `kubectl describe` and `kubectl get events` tell the story of the object.
func RecordConditionChanges(recorder events.EventRecorder, obj Object, before []metav1.Condition) {
	for _, e := range ConditionChanges(before, obj.GetConditions()) {
		recorder.Eventf(obj, nil, e.Type, e.Reason, e.Action, "%s", e.Note)
	}
}
