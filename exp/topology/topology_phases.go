package topology

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
)

// Event reasons, on the Cluster.
const (
	// ReasonCreated, ReasonUpdated, ReasonDeleted: a GuestIngress, GuestWebhookBridge or
	// GuestNodeIdentity was created, its spec changed, or it was deleted, following the
	// variable.
	ReasonCreated = "TopologyObjectCreated"
	ReasonUpdated = "TopologyObjectUpdated"
	ReasonDeleted = "TopologyObjectDeleted"
	// ReasonConflict: the variable asks for an object whose name is taken by one this
	// controller did not make; it is left alone.
	ReasonConflict = "TopologyObjectConflict"
	// ReasonVariableInvalid: the value cannot be read, or the apiserver refused the object
	// made from it (the note carries its message); nothing changed.
	ReasonVariableInvalid = "TopologyVariableInvalid"

	eventAction = "ApplyTopologyVariable"
)

// reconcileObject makes the Cluster's object of kind k follow the variable: applied when the
// variable has its part, deleted (when it is this controller's) when it has not.
func (r *Reconciler) reconcileObject(ctx context.Context, s *scope, k managedKind) error {
	live, err := r.getLive(ctx, s, k)
	if err != nil {
		return err
	}
	spec := k.spec(s.variable)
	if spec == nil {
		return r.deleteOwned(ctx, s, k, live)
	}
	if live != nil && !Owns(s.cluster, live) {
		r.recorder.Eventf(s.cluster, live, corev1.EventTypeWarning, ReasonConflict, eventAction,
			"%s %s/%s exists and was not made from the topology variable (it lacks the label %s=%s or this Cluster as controller owner): "+
				"guestnet leaves it alone and does not apply %s.%s; delete or rename it, or remove %s from the variable",
			k.kind, live.GetNamespace(), live.GetName(), ManagedLabel, ManagedValue, VariableName, k.field, k.field)
		return nil
	}
	if live != nil && !live.GetDeletionTimestamp().IsZero() {
		// Still being deleted (its finalizer undoes what it did): its deletion brings the
		// Cluster back, and then it is created again.
		return nil
	}
	return r.apply(ctx, s, k, spec, live)
}

// getLive reads the Cluster's object of kind k from the cache; nil when there is none.
func (r *Reconciler) getLive(ctx context.Context, s *scope, k managedKind) (client.Object, error) {
	obj := k.newObject()
	key := client.ObjectKey{Namespace: s.cluster.Namespace, Name: ObjectName(s.cluster)}
	if err := r.Client.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("getting %s %s: %w", k.kind, key, err)
	}
	return obj, nil
}

// apply server-side applies the object made from spec. The object's UID, when it exists, goes
// with the request: should it have been replaced by someone else's since the cache saw it,
// the apiserver refuses the change (metadata.uid is immutable) instead of taking it over. A
// refused value leaves the object as it is, and is reported with the apiserver's message.
func (r *Reconciler) apply(ctx context.Context, s *scope, k managedKind, spec map[string]any, live client.Object) error {
	kind := k.kind
	desired := Desired(kind, s.cluster, spec, r.WatchFilterValue)
	if live != nil {
		desired.SetUID(live.GetUID())
	}
	err := ssa.ApplyObject(ctx, r.Client, desired, FieldManager)
	if refused(err) {
		outcome := fmt.Sprintf("no %s is created until it is fixed", kind)
		if live != nil {
			outcome = fmt.Sprintf("%s %s keeps its current spec", kind, live.GetName())
		}
		r.recorder.Eventf(s.cluster, live, corev1.EventTypeWarning, ReasonVariableInvalid, eventAction,
			"%s.%s is not a valid %s spec: %s; %s", VariableName, k.field, kind, ssa.APIErrorMessage(err), outcome)
		return nil
	}
	if err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), err)
	}

	// desired holds the apiserver's answer.
	switch {
	case live == nil:
		record.Written(ctx, r.recorder, s.cluster, record.Write{Type: corev1.EventTypeNormal, Reason: ReasonCreated, Action: eventAction,
			Object: desired, Note: fmt.Sprintf("Created %s %s from the topology variable %s.%s", kind, desired.GetName(), VariableName, k.field)})
	case desired.GetGeneration() != live.GetGeneration():
		record.Written(ctx, r.recorder, s.cluster, record.Write{Type: corev1.EventTypeNormal, Reason: ReasonUpdated, Action: eventAction,
			Object: desired, Note: fmt.Sprintf("Updated %s %s from the topology variable %s.%s", kind, desired.GetName(), VariableName, k.field)})
	}
	return nil
}

// refused recognises the apiserver's refusal of an applied object: Invalid (the CRD's
// validation) or BadRequest, or a field the CRD does not have, which the apiserver's field
// manager refuses with a plain error that reaches the client as a 500 without a reason.
func refused(err error) bool {
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return true
	}
	var status apierrors.APIStatus
	return errors.As(err, &status) && status.Status().Code == http.StatusInternalServerError &&
		strings.Contains(status.Status().Message, "field not declared in schema")
}

// deleteOwned deletes live when it is this controller's: the variable no longer has its part.
// Someone else's object is not touched.
func (r *Reconciler) deleteOwned(ctx context.Context, s *scope, k managedKind, live client.Object) error {
	kind := k.kind
	if live == nil || !Owns(s.cluster, live) || !live.GetDeletionTimestamp().IsZero() {
		return nil
	}
	uid := live.GetUID()
	if err := r.Client.Delete(ctx, live, client.Preconditions{UID: &uid}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("deleting %s %s/%s: %w", kind, live.GetNamespace(), live.GetName(), err)
	}
	record.Written(ctx, r.recorder, s.cluster, record.Write{Type: corev1.EventTypeNormal, Reason: ReasonDeleted, Action: eventAction,
		Object: live, Note: fmt.Sprintf("Deleted %s %s: the topology variable %s has no %s any more", kind, live.GetName(), VariableName, k.field)})
	return nil
}
