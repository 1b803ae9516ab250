// Package status is how a guestnet reconcile reports: the Ready and Deleting conditions every
// guestnet object carries, bounded messages, and the deferred write of what the reconcile
// changed (Patch), skipping reads the cache has not caught up on (OwnWrites).
package status

import (
	"fmt"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Object is a guestnet object with conditions.
type Object interface {
	client.Object
	conditions.Setter
}

// SetReadyCondition summarises the given condition types of obj into Ready, with CAPI's
// default merge strategy: False when any of them is False, with the reason of the first False
// one in the order given (so Ready names what is wrong: ClusterNotFound, NotAllowed, ...);
// Unknown (reason NotReady) when none is False but one is Unknown or not reported yet; True
// (reason Ready) when all are True. While obj is being deleted Ready is False with reason
// Deleting, whatever the other conditions say (SetDeletingCondition).
func SetReadyCondition(obj Object, summarised ...string) {
	if !obj.GetDeletionTimestamp().IsZero() {
		SetDeletingCondition(obj, "Being deleted: guestnet is undoing what it did for this object")
		return
	}
	ready, err := conditions.NewSummaryCondition(obj, guestnetv1.ReadyCondition,
		conditions.ForConditionTypes(summarised),
		conditions.CustomMergeStrategy{MergeStrategy: conditions.DefaultMergeStrategy(
			conditions.ComputeReasonFunc(firstIssueReason),
		)},
	)
	if err != nil {
		// Only a programming error (an empty or invalid list of types) gets here.
		ready = &metav1.Condition{
			Type:    guestnetv1.ReadyCondition,
			Status:  metav1.ConditionUnknown,
			Reason:  guestnetv1.InternalErrorReason,
			Message: fmt.Sprintf("Cannot summarise conditions: %v", err),
		}
	}
	ready.Message = boundMessage(ready.Message)
	conditions.Set(obj, *ready)
}

// firstIssueReason is the reason of Ready: that of the first False condition (the merge
// strategy sorts them in the summary's order), NotReady when only Unknown ones fall short.
func firstIssueReason(issues, unknown, _ []conditions.ConditionWithOwnerInfo) string {
	switch {
	case len(issues) > 0 && issues[0].Reason != "":
		return issues[0].Reason
	case len(issues) > 0 || len(unknown) > 0:
		return guestnetv1.NotReadyReason
	default:
		return guestnetv1.ReadyReason
	}
}

// SetDeletingCondition sets Ready to False with reason Deleting and message, which says what
// the deletion waits for, if anything.
func SetDeletingCondition(obj Object, message string) {
	conditions.Set(obj, metav1.Condition{
		Type:    guestnetv1.ReadyCondition,
		Status:  metav1.ConditionFalse,
		Reason:  guestnetv1.DeletingReason,
		Message: boundMessage(message),
	})
}

// maxReadyMessage keeps Ready's message (a summary of the others) well within the 32768
// bytes the API allows.
const maxReadyMessage = 8192

func boundMessage(m string) string { return Bound(m, maxReadyMessage) }

// Bound cuts s to at most n bytes, at a rune boundary, ending in "..." when it was cut: every
// message guestnet writes is bounded.
func Bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
