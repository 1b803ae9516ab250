package guestwebhookbridge

import (
	"context"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
)

// writeGuestObjects makes the plan's changes to the guest's APIServices and webhook
// configurations (obs is what the plan was made from): each object is written once, with all
// its changes, as one JSON patch of guestnet's fields only (bridge.GuestPatch), which carries
// the observed resourceVersion: if anyone changed the object since (cainjector, Helm), the
// patch fails with a conflict and the next reconcile starts from the new state. An object
// that cannot be written does not stop the others; the errors are returned together.
func (r *Reconciler) writeGuestObjects(ctx context.Context, s *scope, plan *bridge.Plan, obs bridge.Observed, guest client.Client) error {
	me := ownership.BridgeID(s.bridge)
	objects, byObject := plan.Changes()
	var errs []error
	for _, key := range objects {
		tps := byObject[key]
		observed := obs.Object(tps[0].Target)
		if observed == nil {
			continue
		}
		obj := observed.DeepCopyObject().(client.Object)
		done, err := bridge.Apply(obj, tps, me)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		data, err := bridge.GuestPatch(observed, obj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if data == nil {
			continue
		}
		if err := guest.Patch(ctx, observed.DeepCopyObject().(client.Object), client.RawPatch(types.JSONPatchType, data),
			client.FieldOwner(ownership.FieldManager)); err != nil {
			errs = append(errs, fmt.Errorf("patching %s in the guest: %w", key, err))
			continue
		}
		// One event per reason and object: events.k8s.io folds events of the same reason,
		// regarding and related object into one series, whatever their notes say.
		var reasons []string
		notes := map[string][]string{}
		repairs := map[string]metrics.RepairKind{}
		for _, tp := range done {
			reason, note := changeNote(s.bridge, tp)
			if _, ok := notes[reason]; !ok {
				reasons = append(reasons, reason)
			}
			notes[reason] = append(notes[reason], note)
			if k := repairOf(s.bridge, tp); k != "" && repairs[reason] != metrics.RepairKindOfTarget(tp.Kind) {
				repairs[reason] = k // the target itself over its record: one repair per write
			}
		}
		for _, reason := range reasons {
			record.Written(ctx, r.recorder, s.bridge, record.Write{Type: corev1.EventTypeNormal, Reason: reason, Action: actionRewrite,
				Object: targetObject(tps[0].Target), Note: strings.Join(notes[reason], "; "), Repair: repairs[reason]})
		}
	}
	return kerrors.NewAggregate(errs)
}

// changeNote is the event reason and note of a change made to a target of gwb (an event of
// gwb's namespace: it names no other namespace's bridge).
func changeNote(gwb *guestnetv1.GuestWebhookBridge, tp *bridge.TargetPlan) (reason, note string) {
	switch {
	case tp.Action == bridge.ForgetAction:
		return eventForgot, fmt.Sprintf("Left %s to its new owner: its url was changed after guestnet bridged it", tp.Target)
	case tp.Action == bridge.RestoreAction && tp.Rewritten:
		return eventRestored, fmt.Sprintf("Restored the original service reference of %s", tp.Target)
	case tp.Action == bridge.RestoreAction:
		return eventRestored, fmt.Sprintf("Dropped guestnet's record of %s: it no longer holds what guestnet wrote", tp.Target)
	case tp.TookOverFrom != "":
		return eventRepaired, fmt.Sprintf("Took over %s from %s, which no longer exists, with its original: %s", tp.Target,
			bridge.Named(tp.TookOverFrom, gwb), describeRewrite(tp))
	case tp.RecordOnly:
		return eventRepaired, fmt.Sprintf("Repaired the record of %s on the guest object from the bridge's host copy (annotation %s was missing, damaged or stale)",
			tp.Target, guestnetv1.BridgeOriginalAnnotation)
	case tp.Rewritten || tp.Record != nil:
		return eventRepaired, fmt.Sprintf("Repaired %s (it no longer pointed at the bridge): %s", tp.Target, describeRewrite(tp))
	}
	return eventBridged, fmt.Sprintf("Bridged %s: %s", tp.Target, describeRewrite(tp))
}

// repairOf is the kind of repair a change to a target is: a target that no longer pointed at
// the bridge (a Helm upgrade that replaced the whole object is seen as a new target: it
// counts when the bridge's status says it was bridged, see wasBridged), or its record on
// the guest object; empty for anything else (a first rewrite, a restore, a takeover from a
// bridge that is gone).
func repairOf(gwb *guestnetv1.GuestWebhookBridge, tp *bridge.TargetPlan) metrics.RepairKind {
	reason, _ := changeNote(gwb, tp)
	switch {
	case reason == eventRepaired && tp.TookOverFrom == "" && tp.RecordOnly:
		return metrics.RepairBridgeRecord
	case reason == eventRepaired && tp.TookOverFrom == "",
		reason == eventBridged && wasBridged(gwb, tp.Target):
		return metrics.RepairKindOfTarget(tp.Kind)
	}
	return ""
}

// wasBridged reports whether the status, computed for the current spec, says the bridge had
// pointed t at itself.
func wasBridged(gwb *guestnetv1.GuestWebhookBridge, t bridge.Target) bool {
	if gwb.Generation != gwb.Status.ObservedGeneration {
		return false
	}
	for _, st := range gwb.Status.Targets {
		if st.Kind == t.Kind && st.Name == t.Name && st.Webhook == t.Webhook && st.Bridged && (st.URL != "" || st.HostService != "") {
			return true
		}
	}
	return false
}

// recordWrite logs a write guestnet made, at the default level, and records it as an event
// on the bridge (related: the object written, or nil); repair is set when the write puts back
// what someone else changed (record.Write).
func (r *Reconciler) recordWrite(ctx context.Context, gwb *guestnetv1.GuestWebhookBridge, related client.Object, eventType, reason, action, note string, repair metrics.RepairKind) {
	record.Written(ctx, r.recorder, gwb, record.Write{Type: eventType, Reason: reason, Action: action, Object: related, Note: note, Repair: repair})
}

// repairKind is kind when applying a Service of backend hostService now puts back what someone
// else changed or deleted: the spec is the one the status was computed for, and that status
// already listed a target through this backend, so its Services were as guestnet wants them.
// Empty otherwise.
func repairKind(gwb *guestnetv1.GuestWebhookBridge, hostService string, kind metrics.RepairKind) metrics.RepairKind {
	if gwb.Generation != gwb.Status.ObservedGeneration {
		return ""
	}
	for _, t := range gwb.Status.Targets {
		if t.HostService == hostService {
			return kind
		}
	}
	return ""
}

// maxEventNote keeps a note within the 1 kB events.k8s.io allows.
const maxEventNote = 1000

// targetObject is an empty object of t's kind and name, to name it as an event's related object.
func targetObject(t bridge.Target) client.Object {
	meta := metav1.ObjectMeta{Name: t.Name}
	switch t.Kind {
	case guestnetv1.APIServiceTarget:
		return &apiregistrationv1.APIService{ObjectMeta: meta}
	case guestnetv1.MutatingWebhookTarget:
		return &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: meta}
	default:
		return &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: meta}
	}
}
