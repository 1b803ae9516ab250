// Package record is how guestnet tells what it did: an Event for every condition change and
// for every write it makes to an object it does not own (create, apply, delete, rewrite,
// restore), each logged at the default level next to its Event, with the object and why.
package record

import (
	"context"
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
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
	for _, c := range changedConditions(before, after) {
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

// changedConditions are the conditions of after whose status or reason differs from before's
// (or that before lacks).
func changedConditions(before, after []metav1.Condition) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range after {
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		out = append(out, c)
	}
	return out
}

// eventType is Warning when the condition reports a problem the user may have to act on.
// Paused=True is deliberate (set by the user or clusterctl), so it is Normal.
func eventType(c metav1.Condition) string {
	if c.Status == metav1.ConditionFalse && c.Type != guestnetv1.PausedCondition {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// Conditions records an event on obj for each condition that changed since
// before, so `kubectl describe` and `kubectl get events` tell the story of the object, logs
// it at the default level (the log tells the same story as the events, which expire), and
// counts the changes the metrics count (conflicts and policy refusals, once per change).
func Conditions(ctx context.Context, recorder events.EventRecorder, obj status.Object, before []metav1.Condition) {
	log := ctrl.LoggerFrom(ctx).WithCallDepth(1)
	for _, e := range ConditionChanges(before, obj.GetConditions()) {
		log.Info(e.Note, "reason", e.Reason, "action", e.Action)
		recorder.Eventf(obj, nil, e.Type, e.Reason, e.Action, "%s", e.Note)
	}
	for _, c := range changedConditions(before, obj.GetConditions()) {
		metrics.ConditionChanged(c.Type, string(c.Status), c.Reason)
	}
}

// Write is one write guestnet made to an object it manages, as it is logged and recorded.
type Write struct {
	// Type is corev1.EventTypeNormal, or Warning for a write the user should know about.
	Type string
	// Reason and Action are the event's (Applied/Apply, Deleted/Delete, Repaired/Rewrite...).
	Reason, Action string
	// Object is the object written, logged by kind and name and named as the event's related
	// object; nil when the note names it.
	Object client.Object
	// Note says what was written and why.
	Note string
	// Repair is set when the write puts back what someone else changed or deleted: it is
	// counted in guestnet_repairs_total under that kind.
	Repair metrics.RepairKind
}

// maxWriteNote keeps a write's note within the 1 kB events.k8s.io allows.
const maxWriteNote = 1000

// Written logs w at the default level, with the object, why, and the object it was made
// for (regarding), records it as an event on regarding, and counts it when it is a repair:
// every write guestnet makes goes through here, as CAPI's controllers log and record theirs.
// A nil recorder (unit tests) only logs.
func Written(ctx context.Context, recorder events.EventRecorder, regarding client.Object, w Write) {
	log := ctrl.LoggerFrom(ctx).WithCallDepth(1) // the line of the caller, not this one
	kv := []any{"reason", w.Reason, "action", w.Action}
	if w.Object != nil {
		kv = append(kv, kindOf(w.Object), klog.KObj(w.Object))
	}
	if w.Repair != "" {
		kv = append(kv, "repair", string(w.Repair))
		metrics.Repaired(w.Repair)
	}
	log.Info(w.Note, kv...)
	if recorder != nil {
		recorder.Eventf(regarding, w.Object, w.Type, w.Reason, w.Action, "%s", status.Bound(w.Note, maxWriteNote))
	}
}

// kindOf is obj's kind: from its type meta, else its Go type's name (typed objects read
// through a client have no type meta).
func kindOf(obj client.Object) string {
	if kind := obj.GetObjectKind().GroupVersionKind().Kind; kind != "" {
		return kind
	}
	t := reflect.TypeOf(obj)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}
