package guestwebhookbridge

import (
	"context"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
)

// objectEdits collects the changes of one reconcile to the guest's APIServices and webhook
// configurations, so that each object is written once, with all its changes together (a
// configuration's webhooks, and the record of each, live in one object).
type objectEdits struct {
	observed bridge.Observed
	order    []string
	byObject map[string][]edit
}

type edit struct {
	target bridge.Target
	apply  func(client.Object) (bool, error)
	reason string
	note   string
}

func newObjectEdits(obs bridge.Observed) *objectEdits {
	return &objectEdits{observed: obs, byObject: map[string][]edit{}}
}

func (e *objectEdits) add(t bridge.Target, apply func(client.Object) (bool, error), reason, note string) {
	key := string(t.Kind) + "/" + t.Name
	if _, ok := e.byObject[key]; !ok {
		e.order = append(e.order, key)
	}
	e.byObject[key] = append(e.byObject[key], edit{target: t, apply: apply, reason: reason, note: note})
}

// write applies the edits to a copy of each object as observed and updates it with the
// observed resourceVersion: if anyone changed the object since (cainjector, Helm), the update
// fails with a conflict and the next reconcile starts from the new state.
func (e *objectEdits) write(ctx context.Context, guest client.Client, recorder events.EventRecorder, gwb *guestnetv1.GuestWebhookBridge) error {
	for _, key := range e.order {
		edits := e.byObject[key]
		obj := e.object(edits[0].target)
		if obj == nil {
			continue
		}
		var done []edit
		for _, ed := range edits {
			changed, err := ed.apply(obj)
			if err != nil {
				return err
			}
			if changed {
				done = append(done, ed)
			}
		}
		if len(done) == 0 {
			continue
		}
		// The cache keeps only guestnet's managedFields entries: sending them would drop
		// everyone else's. Without managedFields the apiserver keeps them as they are.
		obj.SetManagedFields(nil)
		if err := guest.Update(ctx, obj); err != nil {
			return fmt.Errorf("updating %s in the guest: %w", key, err)
		}
		// One event per reason and object: events.k8s.io folds events of the same reason,
		// regarding and related object into one series, whatever their notes say.
		var reasons []string
		notes := map[string][]string{}
		for _, ed := range done {
			if _, ok := notes[ed.reason]; !ok {
				reasons = append(reasons, ed.reason)
			}
			notes[ed.reason] = append(notes[ed.reason], ed.note)
		}
		for _, reason := range reasons {
			recorder.Eventf(gwb, obj, corev1.EventTypeNormal, reason, actionRewrite, "%s", strings.Join(notes[reason], "; "))
		}
	}
	return nil
}

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

// object is a copy of the observed object t belongs to.
func (e *objectEdits) object(t bridge.Target) client.Object {
	switch t.Kind {
	case guestnetv1.APIServiceTarget:
		for i := range e.observed.APIServices {
			if e.observed.APIServices[i].Name == t.Name {
				return e.observed.APIServices[i].DeepCopy()
			}
		}
	case guestnetv1.ValidatingWebhookTarget:
		for i := range e.observed.ValidatingWebhooks {
			if e.observed.ValidatingWebhooks[i].Name == t.Name {
				return e.observed.ValidatingWebhooks[i].DeepCopy()
			}
		}
	case guestnetv1.MutatingWebhookTarget:
		for i := range e.observed.MutatingWebhooks {
			if e.observed.MutatingWebhooks[i].Name == t.Name {
				return e.observed.MutatingWebhooks[i].DeepCopy()
			}
		}
	}
	return nil
}
